"""An agent that its rendezvous, not its training, ends exits RENDEZVOUS_EXIT after one line (elasticjob_warm/
rdzvexit.py), and one whose worker failed first keeps torchrun's exit. The decision table in this process, then
real agents (`python -m elasticjob_warm.torchrun`, seconds: each imports torch) on a TCPStore on the loopback,
their rendezvous closed the way anyone who reaches the store's port could close it: a fully valid state."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from datetime import UTC, datetime

import pytest
import torch.distributed as dist
from store_states import A, make_state
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import api as rdzv_api

from elasticjob_store import state as rdzv_state
from elasticjob_warm import rdzvexit

RUN_ID = "closed"
KEY = rdzv_state.state_key(RUN_ID)


@pytest.mark.parametrize("error, worker_failed, expected", [
    (rdzv_api.RendezvousClosedError(), False, rdzvexit.RENDEZVOUS_EXIT),
    (rdzv_api.RendezvousStateError("corrupt"), False, rdzvexit.RENDEZVOUS_EXIT),
    (rdzv_api.RendezvousConnectionError("gone"), False, rdzvexit.RENDEZVOUS_EXIT),
    (rdzv_api.RendezvousTimeoutError(), False, rdzvexit.RENDEZVOUS_EXIT),
    (pickle.UnpicklingError("refused: state is not base64"), False, rdzvexit.RENDEZVOUS_EXIT),
    (rdzv_api.RendezvousClosedError(), True, None),  # a worker failed first: torchrun's exit, charged
    (rdzv_api.RendezvousClosedError(), None, None),  # not known (torch's agent not the known one): as torchrun
    (rdzv_api.RendezvousGracefulExitError("redundant"), False, None),  # torch's own graceful end
    (ChildFailedError("train.py", {0: ProcessFailure(0, 18, 3, "<N/A>")}), False, None),
    (ValueError("not the rendezvous'"), False, None),
], ids=["closed", "state", "connection", "timeout", "decoder", "after-a-failure", "unknown", "graceful", "child",
        "other"])
def test_which_errors_end_the_agent_with_the_rendezvous_code(error, worker_failed, expected, monkeypatch):
    monkeypatch.setattr(rdzvexit.SEEN, "worker_failed", worker_failed)
    assert rdzvexit.exit_code(error) == expected


@pytest.mark.parametrize("state, joined, failed", [
    ("FAILED", False, True), ("UNHEALTHY", False, True), ("HEALTHY", False, False),
    ("FAILED", True, False),  # the restart's round formed and its workers run: that failure is behind it
], ids=["failed", "unhealthy", "membership", "failed-then-running"])
def test_the_agent_notes_whether_a_worker_failure_led_into_its_rendezvous(state, joined, failed, monkeypatch):
    from torch.distributed.elastic.agent.server import api

    def torch_restart(agent, group):
        if not joined:
            raise rdzv_api.RendezvousClosedError()

    monkeypatch.setattr(api.SimpleElasticAgent, "_restart_workers", torch_restart)
    monkeypatch.setattr(rdzvexit.SEEN, "worker_failed", None)
    assert rdzvexit.apply() and rdzvexit.SEEN.worker_failed is False
    group = type("Group", (), {"state": getattr(api.WorkerState, state)})()
    try:
        api.SimpleElasticAgent._restart_workers(object(), group)
    except rdzv_api.RendezvousClosedError as error:
        assert rdzvexit.exit_code(error) == (None if failed else rdzvexit.RENDEZVOUS_EXIT)
    assert rdzvexit.SEEN.worker_failed is failed


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)


# The worker closes its own rendezvous, as anyone on the store's port could: the state it reads, closed, with one
# fresh node in the wait list (every agent then stops its workers for the next round and meets it closed), then
# waits to be stopped; or, with "fail", closed without a waiter and exit 3 (its agent restarts into the closed round).
WORKER = textwrap.dedent(f"""
    import os, sys, time
    from datetime import datetime, timedelta, timezone
    import torch.distributed as dist
    from elasticjob_store import state as rdzv_state

    port, out, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    state = rdzv_state.decode(store.get({KEY!r}))
    state.closed = True
    if how == "waiter":
        waiter = rdzv_state.NodeDesc("10.9.9.9", 1, 0)
        state.wait_list = {{waiter}}
        state.last_heartbeats[waiter] = datetime.now(timezone.utc)
    store.set({KEY!r}, rdzv_state.encode(state))
    open(os.path.join(out, "closed"), "w").close()
    if how == "fail":
        sys.exit(3)
    time.sleep(120)
""")


def agent(store, tmp_path, *script: str, restarts: int = 0) -> tuple[int, str]:
    env = dict(os.environ, ELASTICJOB_WARM_PRELOAD="decimal", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    with open(tmp_path / "agent.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "elasticjob_warm.torchrun", "--nnodes=1", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={RUN_ID}",
             f"--max-restarts={restarts}", "--rdzv-conf=is_host=false,last_call_timeout=1,keep_alive_interval=1",
             *script], env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return code, (tmp_path / "agent.log").read_text()


def lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith(rdzvexit.LINE)]


def test_a_valid_closed_state_with_a_waiter_ends_a_training_agent_with_the_rendezvous_code(store, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    code, log = agent(store, tmp_path, str(tmp_path / "worker.py"), str(store.port), str(tmp_path), "waiter")
    assert (tmp_path / "closed").exists(), log[-3000:]
    assert code == rdzvexit.RENDEZVOUS_EXIT, log[-3000:]
    assert lines(log) == [f"{rdzvexit.LINE}RendezvousClosedError"], log[-3000:]
    assert "Traceback" not in log[log.index(rdzvexit.LINE):]  # the line is the agent's last word


def test_an_agent_whose_worker_failed_before_the_closed_round_keeps_torchruns_exit(store, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    code, log = agent(store, tmp_path, str(tmp_path / "worker.py"), str(store.port), str(tmp_path), "fail",
                      restarts=1)
    assert (tmp_path / "closed").exists(), log[-3000:]
    assert code == 1 and lines(log) == [], log[-3000:]
    assert "RendezvousClosedError" in log, log[-3000:]


def test_a_late_agent_meeting_a_closed_rendezvous_leaves_with_the_rendezvous_code_before_any_worker(store, tmp_path):
    """As a job that succeeded leaves it: its round complete, closed by its agents as they left."""
    finished = make_state(round=3, complete=True, closed=True, participants=[A], beats={A: 0.5})
    finished.last_heartbeats = {A: datetime.now(UTC)}
    store.set(KEY, rdzv_state.encode(finished))
    (tmp_path / "worker.py").write_text("open(__import__('sys').argv[1], 'w').close()\n")
    code, log = agent(store, tmp_path, str(tmp_path / "worker.py"), str(tmp_path / "ran"))
    assert code == rdzvexit.RENDEZVOUS_EXIT, log[-3000:]
    assert lines(log) == [f"{rdzvexit.LINE}RendezvousClosedError"] and not (tmp_path / "ran").exists()
