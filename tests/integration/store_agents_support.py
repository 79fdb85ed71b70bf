"""Real torchrun agents on loopback addresses around a real `python -m elasticjob_store`, no Kubernetes.

Each agent runs as a local "pod": `unshare --pid --fork --kill-child torchrun ...` in a session of its own, so
the agent is pid 1 of its PID namespace as in a container, and SIGKILL of the session kills the whole tree the
way a container runtime does (torchrun starts its workers in sessions of their own, so killing the agent's
process group alone would leave them training).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from elasticjob_store.protocol import control_port
from helpers import wait_for
from store_process import start_store_process

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "store_agents_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
TOKEN = "integration-token-" * 2
RDZV_CONF = "is_host=false,last_call_timeout=2,keep_alive_interval=2,keep_alive_max_attempt=3"
CAN_UNSHARE = os.geteuid() == 0 and shutil.which("unshare") is not None



def _stop_session(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGKILL every process of a started session (also stopped ones) and reap the leader."""
    if proc.poll() is None:
        for child in _tree(proc.pid):
            _signal(child, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=timeout)


def _tree(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [pid] + [child.pid for child in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Store:
    proc: subprocess.Popen
    port: int
    output: Path

    def api(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", control_port(self.port), timeout=10)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
        finally:
            conn.close()
        assert response.status == 200, (method, path, body, response.status, answer)
        return answer

    def state(self) -> dict[str, Any]:
        return self.api("GET", "/v1/state")

    def log(self) -> str:
        return self.output.read_text()


@dataclass
class Agent:
    addr: str
    proc: subprocess.Popen
    output: Path

    def kill(self) -> None:
        """The pod's processes all die at once, as when its container is killed."""
        _stop_session(self.proc)

    def freeze(self) -> None:
        """Every process of the pod stops, sockets left open: a frozen peer (no TCP reset)."""
        for pid in _tree(self.proc.pid):
            _signal(pid, signal.SIGSTOP)


@dataclass
class Cluster:
    """One store and its agents, in a temporary directory; close() leaves no process behind."""

    tmp: Path
    min_nodes: int
    max_nodes: int
    run_id: str = "store-agents"
    store: Store | None = None
    agents: list[Agent] = field(default_factory=list)
    progress: Path = field(init=False)

    def __post_init__(self) -> None:
        self.progress = self.tmp / "progress.jsonl"
        self.progress.touch()

    def start_store(self, **extra: str) -> Store:
        token = self.tmp / "token"
        token.write_text(TOKEN)
        env = {**os.environ, "ELASTICJOB_RDZV_RUN_ID": self.run_id,
               "ELASTICJOB_RDZV_MIN_NODES": str(self.min_nodes), "ELASTICJOB_RDZV_MAX_NODES": str(self.max_nodes),
               "ELASTICJOB_RDZV_TOKEN_FILE": str(token), **extra}
        output = self.tmp / "store.log"
        proc, port = start_store_process([sys.executable, "-m", "elasticjob_store"], env, output,
                                         lambda port: checked(Store(None, port, output).state()),
                                         start_new_session=True)
        self.store = Store(proc, port, output)
        return self.store

    def start_agent(self, addr: str, warm: bool = False, **env: str) -> Agent:
        """`warm`: the kit's agent (elasticjob_warm.torchrun, as in the operator's pods), else plain torchrun."""
        assert self.store is not None
        agent = [sys.executable, "-m", "elasticjob_warm.torchrun"] if warm else [str(TORCHRUN)]
        command = [*agent, f"--nnodes={self.min_nodes}:{self.max_nodes}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.store.port}",
                   f"--rdzv-id={self.run_id}", f"--rdzv-conf={RDZV_CONF}", f"--local-addr={addr}",
                   "--max-restarts=3", "--monitor-interval=0.1", str(TRAIN)]
        if CAN_UNSHARE:
            command = ["unshare", "--pid", "--fork", "--kill-child", *command]
        full_env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "LOGLEVEL": "INFO",
                    "STORE_TEST_LOG": str(self.progress), "STORE_TEST_NODE": addr, **env}
        output = self.tmp / f"agent-{addr}.log"
        with open(output, "wb") as out:
            proc = subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        agent = Agent(addr, proc, output)
        self.agents.append(agent)
        return agent

    def steps(self) -> list[dict[str, Any]]:
        lines = self.progress.read_text().splitlines()
        return [record for record in map(json.loads, lines) if "step" in record]

    def wait_for_world(self, size: int, after: float = 0.0, timeout: float = 90) -> dict[str, Any]:
        """The first step at this world size logged after `after` (unix time)."""
        def first():
            return next((r for r in self.steps() if r["world_size"] == size and r["time"] > after), None)
        return wait_for(first, timeout, f"a training step at world size {size}", interval=0.1)

    def wait_for_round(self, nodes: int, timeout: float = 90, after_round: int = -1) -> dict[str, Any]:
        """The store's state once a round later than `after_round` is complete with `nodes` participants."""
        return wait_for(self.store.state, timeout, f"a complete round of {nodes} nodes after round {after_round}",
                        until=lambda s: s["complete"] and len(s["participants"]) == nodes
                        and s["round"] > after_round, interval=0.1)

    def diagnostics(self) -> str:
        parts = [f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.tmp.glob("*.log"))]
        return "\n".join(parts)

    def close(self) -> None:
        for agent in self.agents:
            _stop_session(agent.proc)
        if self.store is not None:
            _stop_session(self.store.proc)


def checked(state: dict[str, Any]) -> bool:
    """The store serves, and its check of torch (a child process, a few seconds) is done: nudges may be asked."""
    return not state["torch"].get("checking")


def now() -> float:
    return time.time()
