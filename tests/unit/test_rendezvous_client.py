"""The operator's client of each job's store: replies are untrusted input, requests carry the job's token."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading

import pytest

from elasticjob import rendezvous_client, store_reply
from elasticjob.observe import StoreNode
from elasticjob_store import protocol

KEY = b"operator-key-" * 3
GOOD = {"epoch": "ab12", "round": 3, "complete": True, "closed": False, "failureRounds": 1,
        "lastFailureRoundAt": 1767268800.0,
        "participants": [{"addr": "10.244.0.5", "pid": 1, "localId": 0, "rank": 0, "heartbeatAge": 0.7}],
        "waiting": [{"addr": "10.244.0.6", "heartbeatAge": None}]}


def test_a_valid_state_becomes_a_store_view():
    view = store_reply.parse_state(json.dumps(GOOD).encode())
    assert (view.epoch, view.round, view.complete, view.failure_rounds, view.nodes) == ("ab12", 3, True, 1, 1)
    assert view.participants == (StoreNode("10.244.0.5", 0.7),)
    assert view.waiting == (StoreNode("10.244.0.6", None),)
    assert view.last_failure_round_at.isoformat() == "2026-01-01T12:00:00+00:00"


def test_the_current_rounds_completion_comes_from_the_stores_history():
    rounds = [{"round": 2, "nodes": ["10.244.0.5"], "completedAt": 1767268700.0},
              {"round": 3, "nodes": ["10.244.0.5"], "completedAt": 1767268800.0}]
    view = store_reply.parse_state(json.dumps({**GOOD, "rounds": rounds}).encode())
    assert view.round_completed_at.isoformat() == "2026-01-01T12:00:00+00:00"
    assert store_reply.parse_state(json.dumps(GOOD).encode()).round_completed_at is None  # an older store
    assert view.round_forming_since is None, "a store from before formingSince"
    forming = [{**rounds[1], "formingSince": 1767268799.5}]
    view = store_reply.parse_state(json.dumps({**GOOD, "rounds": forming}).encode())
    assert view.round_forming_since.isoformat() == "2026-01-01T11:59:59.500000+00:00"
    assert store_reply.parse_state(json.dumps({**GOOD, "rounds": [{**forming[0], "formingSince": -1}]}).encode()) \
        is None
    assert store_reply.parse_state(json.dumps({**GOOD, "rounds": [{"round": 3}]}).encode()) is None


def test_the_latest_completed_rounds_agents_come_from_the_stores_history():
    rounds = [{"round": 3, "nodes": ["10.244.0.5", "10.244.0.6"], "completedAt": 1767268800.0},
              {"round": 2, "nodes": ["10.244.0.5"], "completedAt": 1767268700.0}]
    view = store_reply.parse_state(json.dumps({**GOOD, "rounds": rounds}).encode())
    assert view.last_round_nodes == ("10.244.0.5", "10.244.0.6")
    assert store_reply.parse_state(json.dumps(GOOD).encode()).last_round_nodes == ()
    bad = [{"round": 3, "nodes": ["not-an-address"], "completedAt": 1767268800.0}]
    assert store_reply.parse_state(json.dumps({**GOOD, "rounds": bad}).encode()) is None


@pytest.mark.parametrize("change", [
    {"round": "x"},                      # the reply that made every reconcile fail for ever
    {"round": -1},
    {"round": 2.5},
    {"failureRounds": "1"},
    {"epoch": "../../etc"},
    {"epoch": ""},
    {"complete": "yes"},
    {"participants": [{"addr": "not-an-ip"}]},
    {"participants": [{"addr": "10.0.0.1; rm -rf /"}]},
    {"participants": "all"},
    {"participants": [{"addr": "10.0.0.1", "heartbeatAge": "old"}]},
    {"lastFailureRoundAt": -5},
])
def test_malformed_replies_are_rejected(change):
    assert store_reply.parse_state(json.dumps({**GOOD, **change}).encode()) is None


@pytest.mark.parametrize("raw", [b"not json", b"[]", b"null", b'"text"', b"{" * 5000,
                                 json.dumps({**GOOD, "pad": "x" * (2 << 20)}).encode()])
def test_garbage_and_oversized_replies_are_rejected(raw):
    assert store_reply.parse_state(raw) is None


def test_tokens_differ_per_job_and_per_key():
    a = rendezvous_client.derive_token(b"k1", "uid-1")
    assert a == rendezvous_client.derive_token(b"k1", "uid-1")
    assert a != rendezvous_client.derive_token(b"k1", "uid-2")
    assert a != rendezvous_client.derive_token(b"k2", "uid-1")


NOTHING_REMOVED = b'{"removed": [], "changed": false, "refused": null, "reason": "no node at 10.0.0.1"}'


def serve(reply, seen: list, post_reply: bytes = NOTHING_REMOVED):
    """A stand-in store: `reply` (bytes, or a function making them) to every GET, `post_reply` to every POST."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(reply() if callable(reply) else reply)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            seen.append((self.path, self.headers.get("Authorization"), json.loads(self.rfile.read(length))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(post_reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_requests_carry_the_jobs_token_and_replies_are_parsed():
    seen: list = []
    server = serve(json.dumps(GOOD).encode(), seen)
    client = rendezvous_client.StoreClient(KEY)

    async def talk():
        try:
            port = server.server_address[1]
            return (await client.state("127.0.0.1", port, "uid-1"),
                    await client.act("127.0.0.1", port, "uid-1", protocol.Remove("10.0.0.1", 1.5)))
        finally:
            await client.close()

    try:
        view, reply = asyncio.run(talk())
    finally:
        server.shutdown()
    token = rendezvous_client.derive_token(KEY, "uid-1")
    assert view.round == 3 and reply == protocol.RemoveReply(False, "no node at 10.0.0.1")
    assert seen[0] == ("/v1/state", f"Bearer {token}")
    assert seen[1] == ("/v1/remove", f"Bearer {token}", {"addr": "10.0.0.1", "heartbeatBefore": 1.5})


def test_nothing_listening_is_unknown():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = rendezvous_client.StoreClient(KEY)

    async def talk():
        try:
            return await client.state("127.0.0.1", port, "u"), await client.act("127.0.0.1", port, "u",
                                                                                protocol.Complete(2))
        finally:
            await client.close()

    state, reply = asyncio.run(talk())
    assert state is None and reply == protocol.ErrorReply("no answer from the store")


def test_a_store_that_turned_its_nudges_off_says_why():
    off = {**GOOD, "torch": {"version": "2.5.1+cu124", "nudges": False, "why": "torch 2.5.1+cu124 is old"}}
    assert store_reply.parse_state(json.dumps(off).encode()).nudges_off == "torch 2.5.1+cu124 is old"
    on = {**GOOD, "torch": {"version": "2.13.0", "nudges": True, "why": "checked"}}
    assert store_reply.parse_state(json.dumps(on).encode()).nudges_off is None
    assert store_reply.parse_state(json.dumps(GOOD).encode()).nudges_off is None  # an older store
    checking = {**GOOD, "torch": {"version": "2.13.0", "nudges": False, "why": "checking", "checking": True}}
    view = store_reply.parse_state(json.dumps(checking).encode())
    assert view.nudges_off == "checking" and view.nudges_checked is False
    assert store_reply.parse_state(json.dumps(off).encode()).nudges_checked is True


def test_agents_that_ran_plain_torchrun_are_counted_with_the_reason():
    plain = {**GOOD, "torch": {"version": "2.7.1", "nudges": True, "why": "ok",
                               "plainTorchrun": {"agents": 2, "why": "torch 2.99.0 is outside the range"}}}
    view = store_reply.parse_state(json.dumps(plain).encode())
    assert "2 agent start(s) ran plain torchrun" in view.plain_torchrun and "2.99.0" in view.plain_torchrun
    assert store_reply.parse_state(json.dumps(GOOD).encode()).plain_torchrun is None


# --- what a store (the tenant's image) may send ------------------------------------------------------------


def nodes(count: int) -> list[dict]:
    return [{"addr": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", "heartbeatAge": 0.5, "stale": False}
            for i in range(count)]


@pytest.mark.parametrize("field", ["participants", "waiting"])
def test_more_agents_than_the_jobs_max_replicas_is_refused(field):
    assert store_reply.parse_state(json.dumps({**GOOD, field: nodes(8)}).encode(), max_nodes=8) is not None
    assert store_reply.parse_state(json.dumps({**GOOD, field: nodes(9)}).encode(), max_nodes=8) is None
    # And never more than any job may have, whatever the caller allows.
    raw = json.dumps({**GOOD, field: nodes(store_reply.MAX_NODES + 1)}).encode()
    assert store_reply.parse_state(raw, max_nodes=1 << 20) is None


def test_the_largest_valid_reply_fits_and_anything_over_128_kib_is_refused():
    biggest = json.dumps({**GOOD, "participants": nodes(1024), "waiting": nodes(1024)}).encode()
    assert len(biggest) <= store_reply.MAX_REPLY_BYTES == 128 << 10
    assert store_reply.parse_state(biggest, max_nodes=1024) is not None
    padded = json.dumps({**GOOD, "pad": "x" * (128 << 10)}).encode()
    assert store_reply.parse_state(padded) is None


@pytest.mark.parametrize("key", [b"", b"k" * 31])
def test_an_operator_key_shorter_than_32_bytes_is_refused_with_a_clear_error(key):
    with pytest.raises(ValueError, match="at least 32"):
        rendezvous_client.StoreClient(key)


def test_a_stores_words_are_truncated_and_stripped_of_control_characters():
    said = "bad\x1b[31m\r\nFAKE LOG LINE\x00" + "y" * 10_000
    server = serve(json.dumps(GOOD).encode(), [],
                   post_reply=json.dumps({"changed": False, "reason": said, "refused": said}).encode())
    client = rendezvous_client.StoreClient(KEY)

    async def talk():
        try:
            return await client.act("127.0.0.1", server.server_address[1], "uid-1", protocol.Remove("10.0.0.1", 1.0))
        finally:
            await client.close()

    try:
        reply = asyncio.run(talk())
    finally:
        server.shutdown()
    for text in (reply.reason, reply.refused):
        assert len(text) <= store_reply.MAX_STORE_TEXT and text.isprintable()
        assert text.startswith("bad [31m  FAKE LOG LINE")


def test_a_store_that_changes_at_every_answer_wakes_the_job_a_burst_then_once_per_interval():
    """Each answer a new version: the watch hands over the first `burst` views at once (a recovery's few changes in
    a row), then one per interval, not one per answer."""
    answers = iter(range(1_000_000))
    server = serve(lambda: json.dumps({**GOOD, "version": next(answers)}).encode(), [])
    client = rendezvous_client.StoreClient(KEY)
    seen: list[float] = []
    started: list[float] = []

    async def talk():
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def on_view(_view):
            seen.append(loop.time())
            if len(seen) == 6:
                done.set()

        started.append(loop.time())
        task = asyncio.create_task(rendezvous_client.watch(client, "127.0.0.1", server.server_address[1], "u",
                                                           on_view, interval=0.5, burst=3))
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            task.cancel()
            await client.close()

    try:
        asyncio.run(talk())
    finally:
        server.shutdown()
    assert seen[2] - seen[0] < 0.5, seen  # the burst: three views without waiting an interval
    # Then a token bucket's bound: the (i+1)-th answer is asked no sooner than (i+1-burst) intervals after the
    # start. Not each gap >= the interval: a burst slowed by a busy machine earns back part of the next wait.
    assert all(at - started[0] >= (i + 1 - 3) * 0.5 - 0.01 for i, at in enumerate(seen)), (started, seen)


@pytest.mark.parametrize(("idle", "at_once"), [(0.0, 0), (0.25, 0), (0.5, 1), (1.0, 2), (10.0, 4)])
def test_the_pace_refills_one_turn_per_interval_up_to_the_burst(idle, at_once):
    async def turns_without_waiting() -> int:
        loop = asyncio.get_running_loop()
        pace = rendezvous_client.Pace(4, 0.5)
        for _ in range(4):  # the burst: spent at once
            await pace.turn()
        pace.filled_at -= idle  # as if `idle` seconds went by since
        for count in range(6):
            started = loop.time()
            await pace.turn()
            if loop.time() - started > 0.1:
                return count
        return 6

    assert asyncio.run(turns_without_waiting()) == at_once


def test_what_a_store_says_of_its_torch_reaches_the_job_without_control_characters():
    """torch.why and plainTorchrun.why become the job's condition messages and Events."""
    said = "old torch\x1b[2J\r\nWarning FakeEvent"
    view = store_reply.parse_state(json.dumps({**GOOD, "torch": {
        "version": "2.1\n", "nudges": False, "why": said,
        "plainTorchrun": {"agents": 1, "why": said}}}).encode())
    assert view is not None and view.nudges_off is not None and view.plain_torchrun is not None
    for text in (view.nudges_off, view.plain_torchrun):
        assert all(ch.isprintable() for ch in text) and "Warning FakeEvent" in text, text
