"""The start-up reference: the store and two torchrun agents started by hand on this machine, no Kubernetes,
with the settings the operator gives its pods (min 1, max 3 nodes, last call 2 s, keep-alive 2 s x 3).
Seconds from launching them to the first completed step."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
CONF = "is_host=false,join_timeout=600,last_call_timeout=2,close_timeout=10,keep_alive_interval=2," \
       "keep_alive_max_attempt=3,read_timeout=60"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def once() -> float:
    port, run_id = free_port(), uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "ELASTICJOB_RDZV_PORT": str(port),
               "ELASTICJOB_RDZV_RUN_ID": run_id, "ELASTICJOB_RDZV_MIN_NODES": "1", "ELASTICJOB_RDZV_MAX_NODES": "3"}
        started = time.time()
        procs = [subprocess.Popen([sys.executable, "-m", "elasticjob_store"], env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        agent_env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        for i in range(2):
            procs.append(subprocess.Popen(
                [str(TORCHRUN), "--nnodes", "1:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--rdzv-conf", CONF,
                 "--local-addr", f"127.0.0.{11 + i}", str(ROOT / "examples" / "train_ddp.py"), "--steps", "100000",
                 "--step-seconds", "0.25", "--checkpoint-dir", tmp],
                env=agent_env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        progress = Path(tmp) / "progress.jsonl"
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if progress.exists() and progress.read_text().strip():
                    first = json.loads(progress.read_text().splitlines()[0])
                    return first["time"] - started
                time.sleep(0.05)
            raise TimeoutError("the hand-started job took no step in 120 s")
        finally:
            for proc in procs:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def hand_start(runs: int) -> list[float]:
    found = []
    for i in range(runs):
        found.append(once())
        print(f"  {'by hand':>14} start       run {i + 1}: {found[-1]:.1f} s", flush=True)
    return found
