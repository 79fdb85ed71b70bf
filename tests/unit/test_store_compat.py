"""The store on a torch its nudges were not proven on: `python -m elasticjob_store` with torch altered at start
(a sitecustomize), then asked as the operator asks. It must serve c10d, say why, and refuse every nudge."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elasticjob_store import compat
from elasticjob_store.control import Control
from elasticjob_store.protocol import control_port
from elasticjob_warm import notice
from store_process import start_store_process

# Under `make compat` on a torch outside the range (tests/compat/run.py) the degraded tests still run; these not.
in_range_only = pytest.mark.skipif(os.environ.get("COMPAT_EXPECT") == "off", reason="this torch is outside the range")
TOKEN = "compat-token-" * 3
# Run in the store process before its main: each makes this torch look like another one.
ALTERATIONS = {
    "a version outside the range": "import torch; torch.__version__ = '2.99.0'",
    "a missing private name": ("from torch.distributed.elastic.rendezvous import dynamic_rendezvous as d; "
                               "del d._RendezvousState"),
    "another state shape": ("from torch.distributed.elastic.rendezvous import dynamic_rendezvous as d; "
                            "init = d._RendezvousState.__init__\n"
                            "def more(self):\n    init(self); self.generation = 0\n"
                            "d._RendezvousState.__init__ = more"),
}
# torch's import held for a minute: only the check's child imports torch, so only it waits.
SLOW_TORCH = """
import sys, threading
class Slow:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            threading.Event().wait(60)
sys.meta_path.insert(0, Slow())
"""



def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", control_port(port), timeout=10)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def ready(port: int, checked: bool) -> bool:
    """The store answers; with `checked`, its check of torch is done too."""
    status, state = request(port, "GET", "/v1/state")
    return status == 200 and not (checked and state["torch"]["checking"])


@pytest.fixture
def store(tmp_path):
    started = []

    def start(alteration: str | None, checked: bool = True) -> int:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        if alteration:
            (site / "sitecustomize.py").write_text(alteration + "\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               "ELASTICJOB_RDZV_RUN_ID": "compat",
               "ELASTICJOB_RDZV_TOKEN_SHA256": hashlib.sha256(TOKEN.encode()).hexdigest()}
        proc, port = start_store_process([sys.executable, "-m", "elasticjob_store"], env, tmp_path / "store.log",
                                         lambda port: ready(port, checked))
        started.append(proc)
        return port

    start.started = started

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("name", list(ALTERATIONS))
def test_an_unproven_torch_gets_plain_c10d_and_no_nudges(store, tmp_path, name):
    port = store(ALTERATIONS[name])
    # The agents' side still works: a client can use the store.
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("agent-key", b"v")
    assert client.get("agent-key") == b"v"
    status, state = request(port, "GET", "/v1/state")
    assert status == 200 and state["torch"]["nudges"] is False, state
    assert state["round"] is None
    for action, body in [("remove", {"addr": "10.0.0.1", "heartbeatBefore": 1.0}),
                         ("complete", {"liveNodes": 1}), ("restart", {"round": 0})]:
        status, answer = request(port, "POST", f"/v1/{action}", body)
        assert (status == 409 and "nudges are off" in answer["error"]) or (
            status == 200 and answer.get("changed") is False and "nudges are off" in json.dumps(answer)), answer
    assert "nudges OFF" in (tmp_path / "store.log").read_text()


def test_the_version_is_named_in_the_report(store):
    status, state = request(store(ALTERATIONS["a version outside the range"]), "GET", "/v1/state")
    assert state["torch"]["version"] == "2.99.0" and "2.99.0 is outside" in state["torch"]["why"]


@in_range_only
def test_the_store_process_never_loads_torch_and_turns_the_nudges_on_once_its_child_proved_it(store):
    port = store(None)
    status, state = request(port, "GET", "/v1/state")
    assert state["torch"]["nudges"] is True and state["torch"]["checking"] is False, state
    assert state["torch"]["version"] == torch.__version__
    maps = Path(f"/proc/{store.started[-1].pid}/maps").read_text()
    assert "libtorch" not in maps and "libc10" not in maps


def test_while_torch_is_checked_the_store_serves_c10d_and_refuses_nudges_as_checking(store, tmp_path):
    port = store(SLOW_TORCH, checked=False)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("agent-key", b"v")
    assert client.get("agent-key") == b"v"
    status, state = request(port, "GET", "/v1/state")
    assert state["torch"]["checking"] is True and state["torch"]["nudges"] is False, state
    status, answer = request(port, "POST", "/v1/restart", {"round": 0})
    assert "checking this torch" in json.dumps(answer), answer


@in_range_only
def test_this_torch_is_proven():
    verdict = compat.probe()
    assert verdict.nudges, verdict.why


@pytest.mark.parametrize("version, inside", [("2.5.1+cu124", False), ("2.6.0", True), ("2.13.0+cpu", True),
                                             ("2.14.0", False), ("3.0.0", False), ("garbage", False)])
def test_the_range_is_by_minor(version, inside):
    assert compat.in_range(version) is inside


def test_the_worker_images_default_torch_is_one_make_compat_runs_inside_the_range():
    root = Path(__file__).resolve().parents[2]
    base = re.search(r"^ARG BASE=pytorch/pytorch:(\S+?)-", (root / "images" / "worker.Dockerfile").read_text(),
                     re.MULTILINE)[1]
    assert compat.in_range(base)
    assert f'"{base}"' in (root / "tests" / "compat" / "run.py").read_text()


def test_an_agent_that_ran_plain_torchrun_is_reported_by_the_store():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                           timeout=timedelta(seconds=10))
    control = Control(master, "run", 1, 3, verdict=compat.probe())
    assert control.torch_report()["plainTorchrun"] is None
    for _ in range(2):  # what elasticjob_warm.torchrun leaves, twice: two agent starts
        assert notice.main([f"127.0.0.1:{master.port}", "torch 2.99.0 is outside the range"]) == 0
    assert control.torch_report()["plainTorchrun"] == {"agents": 2, "why": "torch 2.99.0 is outside the range"}
    assert (compat.PLAIN_KEY, compat.PLAIN_WHY_KEY, compat.MAX_WHY) == (notice.PLAIN_KEY, notice.WHY_KEY,
                                                                        notice.MAX_WHY)
