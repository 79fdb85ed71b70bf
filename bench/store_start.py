"""How soon a fresh store process answers, on this machine: seconds from starting `python` to a torch client's GET
answered, (a) for the store as its pod runs it, `python -m elasticjob_store` (its pure-Python c10d server behind
the peer gate; its check of torch runs in a child process after it serves) and (b) for torch's own
TCPStore(is_master=True) server, as the store hosted it before (importing torch included). The two alternate run
by run, so that a busy machine weighs on both alike. Prints a table of medians [min-max] over --runs runs.

    .venv/bin/python bench/store_start.py --runs 5

The client is torch's, in this process (torch imported before the clock starts): it dials every 2 ms until the
port takes a connection, then connects as the agents do (VALIDATE, PING), sets a key and GETs it back. Torch's
client makes a DNS query as it connects; where the resolver is slow that shows in both columns alike.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 60.0

OURS = ["-m", "elasticjob_store"]  # the port from ELASTICJOB_RDZV_PORT
# As elasticjob_store/main.py started it before, without the peer check.
TORCHS = ["-c", textwrap.dedent("""
    import sys, threading
    from datetime import timedelta
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                          multi_tenant=True, timeout=timedelta(seconds=60))
    threading.Event().wait()
"""), "{port}"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start(argv: list[str]) -> tuple[float, float]:
    """Seconds from launching the store to its port taking a connection, and to a torch client's GET answered."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "ELASTICJOB_RDZV_PORT": str(port),
           "ELASTICJOB_RDZV_RUN_ID": "bench"}
    began = time.monotonic()
    child = subprocess.Popen([sys.executable, *(a.format(port=port) for a in argv)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while not listening(port):
            if child.poll() is not None:
                raise RuntimeError(f"the store exited: {child.stderr.read().decode() if child.stderr else ''}")
            if time.monotonic() - began > DEADLINE:
                raise TimeoutError(f"the store did not listen within {DEADLINE} s")
            time.sleep(0.002)
        listened = time.monotonic() - began
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=DEADLINE))
        client.set("bench", "1")
        assert client.get("bench") == b"1"
        return listened, time.monotonic() - began
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the store's torch check runs in a child of its own
        child.wait()


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ours: list[tuple[float, float]] = []
    torchs: list[tuple[float, float]] = []
    for run in range(args.runs):
        ours.append(start(OURS))
        torchs.append(start(TORCHS))
        print(f"run {run + 1}: GET answered {ours[-1][1]:.3f} s (ours), {torchs[-1][1]:.3f} s (torch's)",
              file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}, "
          f"torch {torch.__version__}; medians [min-max] of {args.runs} runs, seconds from `python` started\n")
    print("| store | port listening | a torch client's GET answered |\n|---|---|---|")
    print(f"| (a) python -m elasticjob_store (no torch imported) | {cell([o[0] for o in ours])} | "
          f"**{cell([o[1] for o in ours])}** |")
    print(f"| (b) torch's TCPStore(is_master=True) (import torch included) | {cell([t[0] for t in torchs])} | "
          f"{cell([t[1] for t in torchs])} |")


if __name__ == "__main__":
    main()
