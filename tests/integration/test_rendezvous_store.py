"""The rendezvous pod's script, run as the pod runs it (`python -c`), with real torch agents.

It must serve the c10d store to agents, report torch's rendezvous round and nodes on the next port, and
exit 0 on SIGTERM (a graceful pod deletion).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from elasticjob.builders import RENDEZVOUS_SCRIPT
from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/", timeout=2) as response:
        return json.loads(response.read())


def test_store_serves_agents_reports_rounds_and_stops_cleanly(tmp_path):
    port = free_port()
    env = {**os.environ, "ELASTICJOB_RDZV_PORT": str(port), "ELASTICJOB_RDZV_RUN_ID": "run-1"}
    store = subprocess.Popen([sys.executable, "-c", RENDEZVOUS_SCRIPT], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    agents = []
    try:
        assert wait_for(lambda: state(port), 60, "the state endpoint", ignore=(OSError,)) == {"round": None}
        agent_env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        for host in ("127.0.0.2", "127.0.0.3"):
            agents.append(subprocess.Popen(
                [str(TORCHRUN), "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=run-1", "--rdzv-conf=is_host=false,last_call_timeout=1",
                 f"--local-addr={host}", str(ROOT / "examples" / "train_ddp.py"), "--steps", "3",
                 "--checkpoint-dir", str(tmp_path)], env=agent_env, stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT))
        formed = wait_for(lambda: state(port), 90, "both agents in one round",
                          until=lambda s: s.get("nodes") == 2, ignore=(OSError,))
        assert formed["round"] == 0
        assert [a.wait(timeout=120) for a in agents] == [0, 0], "training through the store failed"
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
        store.send_signal(signal.SIGTERM)
        output = store.communicate(timeout=30)[0]
    assert store.returncode == 0, output
    assert "rendezvous store stopping" in output
