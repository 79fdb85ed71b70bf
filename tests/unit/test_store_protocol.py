"""The store's control protocol (elasticjob_store/protocol.py), both sides paired: every request the operator's
planner makes, sent as the controller sends it, is accepted by the real store (its Control behind its real HTTP
server) and does what it says; every answer the store gives reads into the operator's types."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import http.client
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from factory import NOW, job, observed, rdzv, running_status, worker
from kubernetes.client import ApiClient, Configuration

from elasticjob import k8s, planner
from elasticjob.controller.apply import nudge
from elasticjob.controller.context import Context
from elasticjob.controller.context import Gate as ApiGate
from elasticjob.controller.mirror import Mirror
from elasticjob.domain import Settings
from elasticjob.observe import PeersView, ProgressView, StoreNode, StoreView
from elasticjob.rendezvous_client import StoreClient, derive_token
from elasticjob_store import protocol
from elasticjob_store.auth import Credential
from elasticjob_store.compat import Verdict
from elasticjob_store.control import Control
from elasticjob_store.gate import Gate
from elasticjob_store.progress import KEY as PROGRESS_KEY
from elasticjob_store.rdzv_classes import dumps
from elasticjob_store.server import make_server
from elasticjob_store.state import NodeDesc, RendezvousState, state_key

KEY = b"operator-key-" * 3
JOB = job(running_status(), replicas=3)
TOKEN = derive_token(KEY, JOB.ref.uid)
IP = {i: f"10.244.0.{10 + i}" for i in range(3)}
NODE = {i: NodeDesc(IP[i], 1, 0) for i in range(3)}


class Store:
    """A real TCPStore, the store's Control on it (min 2, max 3 nodes, its clock at the planner's NOW) and its
    control endpoint, holding the digest of the job's token as the pod does."""

    def __init__(self) -> None:
        self.tcp = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                                 timeout=timedelta(seconds=10))
        self.gate = Gate(0, 0)  # not listening: what it is told is what counts here (test_store_gate.py for the rest)
        self.control = Control(self.tcp, JOB.ref.uid, 2, 3, clock=NOW.timestamp, log=lambda _: None,
                               gate=self.gate.report)
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        self.server = make_server(self.control, "127.0.0.1", 0, Credential(digest=digest), self.gate)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def report(self, step: int = 100, step_seconds: float = 0.1) -> None:
        """The training's report as rank 0 writes it (elasticjob_progress), read by the store's poller."""
        at = NOW.timestamp()
        body = {"v": 1, "pod": "train-worker-0", "step": step, "stepAt": at - 0.3, "stepSeconds": step_seconds,
                "listens": True, "sentAt": at - 0.1}
        self.tcp.set(PROGRESS_KEY, json.dumps(body))
        self.control.read_progress()

    def write(self, state: RendezvousState) -> None:
        key = state_key(JOB.ref.uid)
        current = self.tcp.get(key) if self.tcp.check([key]) else b""
        self.tcp.compare_set(key, current, base64.b64encode(dumps(state)))  # as an agent's pickle.dumps

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def store() -> Iterator[Store]:
    found = Store()
    yield found
    found.close()


def rendezvous(*ages: float, round: int = 4, complete: bool = True, deadline_in: float | None = None
               ) -> RendezvousState:
    """torch's state with the agents at IP[0], IP[1], ... whose last heartbeats are `ages` seconds before NOW."""
    state = RendezvousState()
    state.round, state.complete = round, complete
    state.deadline = None if deadline_in is None else NOW + timedelta(seconds=deadline_in)
    state.participants = {NODE[i]: i for i in range(len(ages))}
    state.last_heartbeats = {NODE[i]: NOW - timedelta(seconds=age) for i, age in enumerate(ages)}
    return state


def closed(state: RendezvousState) -> RendezvousState:
    state.closed = True
    return state


def view(*ages: float, complete: bool = True) -> StoreView:
    """What the operator last read from that store."""
    return StoreView(epoch="e1", round=4, complete=complete, received_at=NOW,
                     participants=tuple(StoreNode(IP[i], age, age > 2.5) for i, age in enumerate(ages)))


LISTENING = ProgressView(pod="train-worker-0", step=100, step_at=NOW, step_seconds=0.1, listens=True)
SCALED_DOWN = job(running_status(), replicas=2)
WITH_SPARES = job(running_status(), replicas=3, spares=1)

# What the planner asks of a store, from what it sees, and the rendezvous that store holds meanwhile.
SCENARIOS = {
    "a scale-down asks a training that listens to stop first": (
        [worker(0), worker(1), worker(2)], dataclasses.replace(view(0.2, 0.2, 0.2), progress=LISTENING),
        rendezvous(0.2, 0.2, 0.2)),
    "a killed worker is removed": (
        [worker(0), worker(1, "Failed", exit_code=137, finished_at=NOW - timedelta(seconds=0.5)), worker(2)],
        view(0.2, 1.0, 0.2), rendezvous(0.2, 1.0, 0.2)),
    "a frozen worker is removed and the survivors restarted": (
        [worker(0), worker(1, ready=False), worker(2)], view(0.2, 7.0, 0.2), rendezvous(0.2, 7.0, 0.2)),
    "the last call ends with every live agent in": (
        [worker(0), worker(1), worker(2, "Failed", exit_code=1, finished_at=NOW)],
        view(0.2, 0.2, complete=False), rendezvous(0.2, 0.2, complete=False, deadline_in=20)),
    "a round closed while no worker finished is opened again": (
        [worker(0), worker(1, "Failed", exit_code=87, rendezvous_failed="RendezvousClosedError",
                        finished_at=NOW - timedelta(seconds=0.5)), worker(2)],
        dataclasses.replace(view(0.2, 0.2, 0.2), closed=True), closed(rendezvous(0.2, 0.2, 0.2))),
    "the first round waits for a worker still starting": (
        [worker(0), worker(1), worker(2)], dataclasses.replace(view(0.2, 0.2, complete=False), round=0),
        rendezvous(0.2, 0.2, round=0, complete=False, deadline_in=1)),
    "a job with spares tells its store the seats": (
        [worker(0), worker(1), worker(2), worker(3)], view(0.2, 0.2, 0.2), rendezvous(0.2, 0.2, 0.2)),
    "a new store's gate is told the job's pods": (
        [worker(0), worker(1), worker(2)], dataclasses.replace(view(0.2, 0.2, 0.2), peers=PeersView(False, ())),
        rendezvous(0.2, 0.2, 0.2)),
}


def nudges(scenario: str) -> list[planner.StoreAction]:
    pods, seen, _ = SCENARIOS[scenario]
    chosen = SCALED_DOWN if "scale-down" in scenario else WITH_SPARES if "spares" in scenario else JOB
    result = planner.plan(chosen, observed([rdzv()] + pods, store=seen), NOW)
    return [a for a in result.actions if isinstance(a, planner.StoreAction)]


def context() -> Context:
    return Context(kube=k8s.Kube(ApiClient(Configuration())), mirror=Mirror(), stores=StoreClient(KEY),
                   settings=Settings(), logger=logging.getLogger("test"), instance="t", gate=ApiGate())


def test_the_scenarios_make_every_request_the_protocol_has():
    made = {type(action.request) for scenario in SCENARIOS for action in nudges(scenario)}
    assert made == set(protocol.REQUESTS)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_what_the_planner_asks_the_store_does_and_says_so(store, scenario):
    """The controller's nudge (the client, the wire) against the real store: each request is accepted and
    changes the rendezvous; asked again (a reconcile before the next answer), it finds the change made."""
    store.write(SCENARIOS[scenario][2])
    store.report()
    ctx, log = context(), logging.LoggerAdapter(logging.getLogger("test"))
    actions = [dataclasses.replace(a, endpoint=planner.ControlAddress("127.0.0.1", store.port)) for a in nudges(scenario)]

    async def send() -> tuple[list[bool], list[bool]]:
        try:
            first = [await nudge(ctx, JOB.ref, action, log) for action in actions]
            return first, [await nudge(ctx, JOB.ref, action, log) for action in actions]
        finally:
            await ctx.stores.close()

    first, again = asyncio.run(send())
    assert first == [True] * len(actions) and again == [False] * len(actions)


REPLIES = [
    (rendezvous(0.2, 1.0), protocol.Remove(IP[1], NOW.timestamp() - 0.5),
     protocol.RemoveReply(True, "removed 1 node(s) at 10.244.0.11", None, (protocol.NodeRef(IP[1], 1, 0),))),
    (rendezvous(0.2, 0.2), protocol.Remove(IP[1], NOW.timestamp() - 0.5),
     protocol.RemoveReply(False, "1 node(s) at 10.244.0.11 heartbeat after that time")),
    (rendezvous(9.0), protocol.Remove(IP[0], NOW.timestamp()), protocol.RemoveReply(
        False, *["removing 1 node(s) at 10.244.0.10 would empty complete round 4, which no participant has left"] * 2)),
    (rendezvous(0.2, 0.2, complete=False, deadline_in=20), protocol.Complete(2),
     protocol.CompleteReply(True, "round 4 completes at the agents' next poll with 2 node(s)", completed=True)),
    (rendezvous(0.2, 0.2, complete=False, deadline_in=20), protocol.Complete(3),
     protocol.CompleteReply(False, "2 participant(s) but 3 live node(s)")),
    (rendezvous(0.2, 0.2), protocol.Restart(4),
     protocol.RestartReply(True, "agents of round 4 restart their workers at their next check", restarting=True)),
    (rendezvous(0.2, 0.2), protocol.Restart(3), protocol.RestartReply(False, "the round is 4, not 3")),
]


def test_a_stop_is_picked_from_the_latest_report_once_and_repeated_unchanged(store):
    """The store's rule (elasticjob_store/stop.py): the report's step 100, plus the steps of 0.1 s that fit in
    its age when sent (0.2 s) and the margin (2 s), rounded up, plus one: 100 + 22 + 1. Asked again under the
    same name, the same step, unchanged; without a report, no step to agree on."""
    client = StoreClient(KEY)
    asked = protocol.Stop(NOW.timestamp() - 1, 2.0)

    async def send(request: protocol.Stop) -> protocol.ActionReply | protocol.ErrorReply:
        return await client.act("127.0.0.1", store.port, JOB.ref.uid, request)

    async def scenario() -> list[protocol.ActionReply | protocol.ErrorReply]:
        try:
            replies = [await send(asked)]
            store.report()
            return [*replies, await send(asked), await send(asked)]
        finally:
            await client.close()

    none, first, again = asyncio.run(scenario())
    assert none == protocol.StopReply(False, "no step and step time reported yet: no step to agree on")
    assert first == protocol.StopReply(True, "every rank stops after step 123", step=123)
    assert again.changed is False and again.step == 123
    assert json.loads(store.tcp.get("elasticjob.stop.1"))["step"] == 123 and not store.tcp.check(["elasticjob.stop.2"])


@pytest.mark.parametrize(("state", "request_", "expected"), REPLIES)
def test_every_answer_the_store_gives_reads_into_the_operators_type(store, state, request_, expected):
    store.write(state)
    client = StoreClient(KEY)

    async def send() -> protocol.ActionReply | protocol.ErrorReply:
        try:
            return await client.act("127.0.0.1", store.port, JOB.ref.uid, request_)
        finally:
            await client.close()

    assert asyncio.run(send()) == expected


def raw_call(port: int, method: str, path: str, body: bytes | None = None, token: str = TOKEN
             ) -> tuple[int, protocol.ErrorReply]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    return response.status, protocol.ErrorReply.from_wire(answer)


@pytest.mark.parametrize(("method", "path", "body", "token", "status", "said"), [
    ("GET", protocol.STATE, None, "wrong", 401, "bearer token"),
    ("GET", "/v1/nothing", None, TOKEN, 404, "no GET /v1/nothing"),
    ("GET", protocol.path(protocol.Remove), None, TOKEN, 405, "no GET /v1/remove"),
    ("POST", protocol.path(protocol.Complete), b'{"liveNodes": 0}', TOKEN, 400, "liveNodes must be an integer"),
    ("POST", protocol.path(protocol.Restart), b"[", TOKEN, 400, "not JSON"),
    ("POST", protocol.path(protocol.Restart), b"x" * 5000, TOKEN, 413, "larger than"),
    ("GET", f"{protocol.STATE}?wait=61", None, TOKEN, 400, "wait must be from 0 to 60"),
    ("POST", protocol.path(protocol.Stop), b'{"requestedAt": 1, "marginSeconds": 61}', TOKEN, 400,
     "marginSeconds must be a number of seconds from 0 to 60"),
])
def test_every_refusal_reads_as_an_error_reply(store, method, path, body, token, status, said):
    got, reply = raw_call(store.port, method, path, body, token)
    assert got == status and said in reply.error


def test_a_state_the_store_refuses_to_read_answers_an_error_and_a_store_without_nudges_refuses_each_nudge(store):
    store.tcp.set(state_key(JOB.ref.uid), b"not torch's state")
    got, reply = raw_call(store.port, "POST", protocol.path(protocol.Complete), b'{"liveNodes": 2}')
    assert got == 500 and "rendezvous state refused" in reply.error
    store.control.verdict = Verdict("2.99.0", False, "untested torch")
    for request_ in (protocol.Remove("10.0.0.1", 12.5), protocol.Complete(2), protocol.Restart(4)):
        conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
        conn.request("POST", protocol.path(type(request_)), body=json.dumps(request_.to_wire()).encode(),
                     headers={"Authorization": f"Bearer {TOKEN}"})
        answer = json.loads(conn.getresponse().read())
        conn.close()
        assert "nudges are off: untested torch" in json.dumps(answer), (request_, answer)


@pytest.mark.parametrize("message", [
    protocol.Remove("10.0.0.1", 12.5), protocol.Complete(3), protocol.Restart(0),
    protocol.RemoveReply(True, "r", None, (protocol.NodeRef("10.0.0.1", 7, 1),)),
    protocol.RemoveReply(False, "r", "unsafe"), protocol.CompleteReply(True, "c", completed=True),
    protocol.RestartReply(False, "f"), protocol.ErrorReply("e"), protocol.Stop(12.5, 2.0),
    protocol.StopReply(True, "s", step=7), protocol.StopReply(False, "n"),
])
def test_each_type_reads_back_what_it_writes(message):
    assert type(message).from_wire(json.loads(json.dumps(message.to_wire()))) == message


def test_a_reply_may_grow_but_a_request_may_not():
    """A later store may add to its replies (the operator skips what it does not know); a request with a field
    the store does not know is refused: a nudge must never be taken for another."""
    grown = {**protocol.RestartReply(True, "r", restarting=True).to_wire(), "progress": {"step": 3}}
    assert protocol.Restart.reply(grown) == protocol.RestartReply(True, "r", restarting=True)
    with pytest.raises(protocol.Invalid, match="unknown field"):
        protocol.Restart.from_wire({"round": 1, "force": True})


@pytest.mark.parametrize(("kind", "body", "said"), [
    (protocol.Remove, [], "JSON object"),
    (protocol.Remove, {"reason": "r"}, "no changed"),
    (protocol.Remove, {"changed": 1}, "changed is a int"),
    (protocol.Remove, {"changed": False, "refused": 3}, "refused is a int"),
    (protocol.Remove, {"changed": True, "removed": [{"addr": "a", "pid": "1", "localId": 0}]}, "pid is a str"),
    (protocol.Complete, {"changed": False, "completed": "yes"}, "completed is a str"),
    (protocol.Restart, {"changed": False, "reason": None}, "reason is a NoneType"),
])
def test_a_reply_of_the_wrong_types_is_invalid(kind, body, said):
    with pytest.raises(protocol.Invalid, match=said):
        kind.reply(body)


def test_the_protocol_pulls_in_nothing_but_the_standard_library():
    """The operator imports the store's protocol (its requests and replies, its state's reply, their field checks):
    not torch, not the store's other modules."""
    code = ("import sys, elasticjob_store.protocol, elasticjob_store.protocol_state\n"
            "ours = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'pydantic', 'elasticjob', 'elasticjob_store'))\n"
            "assert ours == ['elasticjob_store', 'elasticjob_store.protocol', 'elasticjob_store.protocol_checks',"
            " 'elasticjob_store.protocol_state'], ours\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_operators_long_poll_is_one_every_store_accepts():
    """A store refuses a wait past its MAX_WAIT (60 s in every version since the long-poll): a longer idle poll in
    the operator would watch no store at all."""
    from urllib.parse import parse_qs, urlsplit

    from elasticjob import rendezvous_client

    path = protocol.StateQuery(7, "ab", rendezvous_client.LONG_POLL_SECONDS).path()
    asked = protocol.StateQuery.from_query(parse_qs(urlsplit(path).query))
    assert asked.wait == rendezvous_client.LONG_POLL_SECONDS <= protocol.MAX_WAIT


def test_the_gates_list_and_refusals_read_back_into_the_operators_view(store):
    """What the gate holds, as GET /v1/state says it and the operator reads it (rendezvous_client)."""
    client = StoreClient(KEY)

    async def scenario() -> tuple[StoreView | None, StoreView | None]:
        try:
            before = await client.state("127.0.0.1", store.port, JOB.ref.uid)
            await client.act("127.0.0.1", store.port, JOB.ref.uid, protocol.Peers((IP[1], IP[0])))
            store.gate._refuse("10.9.9.9")
            return before, await client.state("127.0.0.1", store.port, JOB.ref.uid)
        finally:
            await client.close()

    before, after = asyncio.run(scenario())
    assert before is not None and before.peers == PeersView(False, ())
    assert after is not None and after.peers == PeersView(True, (IP[0], IP[1]), 1, ("10.9.9.9",))
