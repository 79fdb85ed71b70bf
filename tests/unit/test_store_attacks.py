"""What anyone who reaches a store's port can make the operator do, through the real parts: torch's state written
into a real TCPStore, the store's Control and HTTP server describing it, the operator's parse_state reading the
reply, the planner deciding on it. The store's word may move the tenant's own rendezvous; it never charges a
restart, fails the job or stops a pod on its own."""

from __future__ import annotations

import base64
import hashlib
import http.client
import threading
from datetime import UTC, datetime, timedelta

import pytest
import torch.distributed as dist
from factory import job, observed, rdzv, running_status, worker
from store_states import agent_pickle, make_state

from elasticjob import planner
from elasticjob.store_reply import parse_state
from elasticjob_store.auth import Credential
from elasticjob_store.control import Control
from elasticjob_store.server import make_server
from elasticjob_store.state import NodeDesc, state_key

RUN_ID = "attacked"
TOKEN = "t" * 64
# Two healthy workers of the job, as the planner's pods have them.
W0, W1 = NodeDesc("10.244.0.10", 1, 0), NodeDesc("10.244.0.11", 1, 0)


class Store:
    """A store pod's parts: a TCPStore (port 29400, which anyone who reaches it may write), its Control and its
    authenticated control endpoint, which the operator reads."""

    def __init__(self) -> None:
        self.tcp = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                                 timeout=timedelta(seconds=10))
        self.control = Control(self.tcp, RUN_ID, 1, 3, log=lambda line: None, stale_after=2.5)
        self.server = make_server(self.control, "127.0.0.1", 0,
                                  Credential(digest=hashlib.sha256(TOKEN.encode()).hexdigest()))
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def write(self, state) -> None:
        """What an attacker at port 29400 does: torch's own compare-and-set, with a state of its choosing."""
        key = state_key(RUN_ID)
        current = self.tcp.get(key) if self.tcp.check([key]) else b""
        raw = base64.b64encode(agent_pickle(state))
        assert self.tcp.compare_set(key, current, raw) == raw

    def answer(self):
        """The store's poller sees the write; the operator's long-poll gets the reply and parses it."""
        self.control.poll()
        conn = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=10)
        conn.request("GET", "/v1/state", headers={"Authorization": f"Bearer {TOKEN}"})
        raw = conn.getresponse().read()
        conn.close()
        view = parse_state(raw)
        assert view is not None, raw[:200]
        return view

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def store():
    made = Store()
    yield made
    made.close()


def plan_on(status, view, now, pods):
    result = planner.plan(job(status, maxRestarts=3), observed([rdzv()] + pods, store=view), now)
    return result, result.status.model_dump(by_alias=True, mode="json")


def test_complete_rounds_written_into_the_store_charge_nothing_and_never_fail_the_job(store):
    """Five complete rounds R+1, R+2, ... by the same two nodes: each a "failure round" to the store's tracker. No
    worker ended and no agent logged a failure, so none is charged (before: restarts 0 -> 4, then Failed)."""
    pods = [worker(0), worker(1)]
    status, now = running_status(), datetime.now(UTC)
    store.write(make_state(round=10, complete=True, participants=[W0, W1]))
    result, status = plan_on(status, store.answer(), now, pods)
    for n in range(1, 6):
        store.write(make_state(round=10 + n, complete=True, participants=[W0, W1]))
        view = store.answer()
        assert view.failure_rounds == n, "the store itself took the write for a failure round"
        result, status = plan_on(status, view, now + timedelta(seconds=5 * n), pods)
    assert result.status.restarts == 0 and result.status.phase == "Running"
    assert [f.reason for f in result.status.last_failures] == ["Unconfirmed"] * 5
    assert not any(f.charged for f in result.status.last_failures)
    assert "no failure the operator saw" in result.status.last_failures[-1].message
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod)]


def test_a_real_in_place_restart_is_still_charged_on_the_agents_exit_line(store):
    """The same store answer, with the exit line a worker's agent logged (read from its pod's log): charged."""
    pods = [worker(0), worker(1)]
    now = datetime.now(UTC)
    store.write(make_state(round=3, complete=True, participants=[W0, W1]))
    _, status = plan_on(running_status(), store.answer(), now, pods)
    store.write(make_state(round=4, complete=True, participants=[W0, W1]))
    logged = [planner.RoundFailure(pod="train-worker-1", exit_code=1, message="E0101 failed (exitcode: 1)")]
    result = planner.plan(job(status, maxRestarts=3), observed([rdzv()] + pods, store=store.answer(),
                                                               round_failures=logged), now + timedelta(seconds=5))
    assert result.status.restarts == 1 and result.status.last_failures[-1].charged


def test_an_old_heartbeat_written_for_a_healthy_worker_does_not_stop_its_pod(store):
    """A complete round listing a healthy worker's IP with a heartbeat a minute old: the store reports it stale,
    the operator may take it out of the tenant's rendezvous, but does not delete its Ready pod nor book a
    Partitioned failure."""
    pods = [worker(0), worker(1)]
    state = make_state(round=7, complete=True, participants=[W0, W1])
    state.last_heartbeats = {W0: datetime.now(UTC) - timedelta(seconds=1), W1: datetime.now(UTC) - timedelta(minutes=1)}
    store.write(state)
    view = store.answer()
    assert [n.stale for n in view.participants] == [False, True]
    status = running_status(rendezvous={"ready": True, "endpoint": "10.96.0.42:29400"})
    result, _ = plan_on(status, view, datetime.now(UTC), pods)
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod)]
    assert result.status.last_failures == [] and result.status.infrastructure_failures == 0
