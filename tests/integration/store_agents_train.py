"""A tiny torchrun worker for the store's agent scenarios: an all_reduce every few hundred milliseconds.

Appends one JSON line per step to $STORE_TEST_LOG: {time, rank, world_size, step, node, restart}. No model and
no DDP (whose constructor alone costs about 2 s of imports), so what the scenarios time is the rendezvous.

Environment:
  STORE_TEST_LOG            the JSON-lines file (required)
  STORE_TEST_NODE           the node's address, copied into every line
  STORE_TEST_PG_TIMEOUT     the process group's timeout in seconds (default 60): bounds a hang on a frozen peer
  STORE_TEST_FAIL_ONCE      a path: the highest rank exits 1 at step 3 unless the file exists, and creates it
  STORE_TEST_MAX_SECONDS    the worker stops by itself after this long (default 300), in case a test leaks it
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STEP_SECONDS = 0.3


def log(record: dict) -> None:
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(os.environ["STORE_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write per line: lines from several workers do not interleave
    finally:
        os.close(fd)


def main() -> None:
    timeout = float(os.environ.get("STORE_TEST_PG_TIMEOUT", "60"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("STORE_TEST_NODE", "")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fail_once = os.environ.get("STORE_TEST_FAIL_ONCE")
    stop_at = time.time() + float(os.environ.get("STORE_TEST_MAX_SECONDS", "300"))
    step = 0
    while time.time() < stop_at:
        try:
            dist.all_reduce(torch.ones(64))
        except Exception as err:  # a peer died or froze: exit at once rather than in Python's slow teardown
            log({"time": time.time(), "rank": rank, "world_size": world, "node": node,
                 "error": f"{type(err).__name__}: {err}"[:300]})
            os._exit(1)
        log({"time": time.time(), "rank": rank, "world_size": world, "step": step, "node": node,
             "restart": restart})
        step += 1
        if fail_once and step == 3 and rank == world - 1 and not os.path.exists(fail_once):
            open(fail_once, "w").close()
            log({"time": time.time(), "rank": rank, "world_size": world, "node": node, "failed": True})
            os._exit(1)
        time.sleep(STEP_SECONDS)
    sys.exit(0)


if __name__ == "__main__":
    main()
