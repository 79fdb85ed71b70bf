"""The store's control endpoint against a real TCPStore: auth, input checks, and that each action changes the
stored state exactly as the pure functions say. Also `python -m elasticjob_store` as the pod runs it."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from store_states import A2, A, B, C, agent_pickle, fields, make_state

from elasticjob_store import actions, compat, wire
from elasticjob_store.auth import Credential
from elasticjob_store.capped import MAX_CONNECTIONS, MAX_PER_PEER
from elasticjob_store.control import Control
from elasticjob_store.protocol import control_port
from elasticjob_store.server import make_server
from elasticjob_store.state import decode, state_key
from elasticjob_store.wire import REQUEST_DEADLINE
from helpers import wait_for
from store_process import start_store_process

RUN_ID = "run-1"
TOKEN = "s3cret-token-" * 3
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()
T0 = 1_900_000_000.0  # the store's clock in these tests


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, tmp_path: Path, credential: Credential) -> None:
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                                   timeout=timedelta(seconds=10))
        self.key = state_key(RUN_ID)
        self.clock = Clock()
        self.lines: list[str] = []
        self.control = Control(self.store, RUN_ID, 2, 3, clock=self.clock, log=self.lines.append)
        self.server = make_server(self.control, "127.0.0.1", 0, credential)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def write(self, state) -> bytes:
        """Writes as torch's backend does: compare_set against the current value."""
        raw = base64.b64encode(agent_pickle(state))
        current = self.store.get(self.key) if self.store.check([self.key]) else b""
        assert self.store.compare_set(self.key, current, raw) == raw
        return raw

    def stored(self):
        return decode(self.store.get(self.key))

    def call(self, method: str, path: str, body=None, token: str | None = TOKEN, raw: bytes | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        try:
            return response.status, json.loads(payload)
        except ValueError:
            return response.status, payload.decode()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # a Secret edited by hand often ends in a newline
    return path


@pytest.fixture
def harness(tmp_path):
    """A store as the operator makes it: the pod holds the token's digest."""
    h = Harness(tmp_path, Credential(digest=DIGEST))
    yield h
    h.server.shutdown()
    h.server.server_close()


def test_healthz_needs_no_token(tmp_path):
    h = Harness(tmp_path, Credential())
    try:
        assert h.call("GET", "/healthz", token=None) == (200, "ok")
    finally:
        h.server.shutdown()


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/v1/state", None),
    ("POST", "/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": T0}),
    ("POST", "/v1/complete", {"liveNodes": 2}),
    ("POST", "/v1/restart", {"round": 0}),
    ("GET", "/no-such-path", None),
])
def test_every_control_request_needs_the_token(harness, method, path, body):
    for token in (None, "wrong", TOKEN + "x", ""):
        status, answer = harness.call(method, path, body, token=token)
        assert status == 401, (token, answer)
    assert harness.call(method, path, body)[0] in (200, 404)


def test_basic_auth_is_not_a_bearer_token(harness):
    conn = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=10)
    conn.request("GET", "/v1/state", headers={"Authorization": "Basic " + TOKEN})
    assert conn.getresponse().status == 401


@pytest.mark.parametrize("setup", ["unset", "missing file", "empty file", "not a digest", "the token as digest"])
def test_no_token_configured_refuses_everything_but_healthz(tmp_path, setup):
    (tmp_path / "empty").write_text("\n")
    credential = {"unset": Credential(), "missing file": Credential(token_file=str(tmp_path / "absent")),
                  "empty file": Credential(token_file=str(tmp_path / "empty")),
                  "not a digest": Credential(digest="abc"), "the token as digest": Credential(digest=TOKEN)}[setup]
    h = Harness(tmp_path, credential)
    try:
        for token in (TOKEN, "", None):
            assert h.call("GET", "/v1/state", token=token)[0] == 401
        assert h.call("GET", "/healthz", token=None) == (200, "ok")
    finally:
        h.server.shutdown()


def test_the_digest_is_not_a_token(harness):
    """Whoever reads the pod spec has the digest: offering it gets nothing."""
    assert harness.call("GET", "/v1/state", token=DIGEST)[0] == 401
    assert harness.call("GET", "/v1/state", token=TOKEN.upper())[0] == 401
    assert harness.call("GET", "/v1/state", token=f" {TOKEN} ")[0] == 200


def test_a_store_pod_from_an_earlier_operator_reads_its_token_file(tmp_path, token_file):
    h = Harness(tmp_path, Credential(token_file=str(token_file)))
    try:
        assert h.call("GET", "/v1/state")[0] == 200
        assert h.call("GET", "/v1/state", token="wrong")[0] == 401
        token_file.write_text("new-token-" * 4)  # a rotated Secret takes effect at once
        assert h.call("GET", "/v1/state")[0] == 401
        assert h.call("GET", "/v1/state", token="new-token-" * 4)[0] == 200
    finally:
        h.server.shutdown()


@pytest.mark.parametrize("path, body, message", [
    ("/v1/remove", {"addr": "pod-1", "heartbeatBefore": T0}, "IPv4 or IPv6"),
    ("/v1/remove", {"addr": 167772161, "heartbeatBefore": T0}, "IPv4 or IPv6"),
    ("/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": "now"}, "unix seconds"),
    ("/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": -1}, "unix seconds"),
    ("/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": 1e300}, "unix seconds"),
    ("/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": True}, "unix seconds"),
    ("/v1/remove", {"addr": "10.0.0.1"}, "missing field(s): heartbeatBefore"),
    ("/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": T0, "force": True}, "unknown field(s): force"),
    ("/v1/complete", {"liveNodes": 0}, "liveNodes must be an integer"),
    ("/v1/complete", {"liveNodes": 2.0}, "liveNodes must be an integer"),
    ("/v1/complete", {"liveNodes": True}, "liveNodes must be an integer"),
    ("/v1/complete", {"liveNodes": "2"}, "liveNodes must be an integer"),
    ("/v1/restart", {"round": -1}, "round must be an integer"),
    ("/v1/restart", {"round": None}, "round must be an integer"),
    ("/v1/restart", [1], "JSON object"),
])
def test_bad_input_is_400_with_a_message(harness, path, body, message):
    harness.write(make_state(round=0, complete=True, participants=[A, B]))
    before = harness.store.get(harness.key)
    status, answer = harness.call("POST", path, body)
    assert status == 400 and message in answer["error"]
    assert harness.store.get(harness.key) == before


@pytest.mark.parametrize("raw, status, message", [
    (b"{not json", 400, "not JSON"),
    (b'{"addr": "10.0.0.1", "heartbeatBefore": NaN}', 400, "unix seconds"),
    (b"\xff\xfe", 400, "not JSON"),
    (b"{" + b" " * 5000 + b"}", 413, "larger than"),
])
def test_bodies_that_are_not_small_json_objects(harness, raw, status, message):
    got, answer = harness.call("POST", "/v1/remove", raw=raw)
    assert got == status and message in answer["error"]


def test_unknown_paths_and_methods(harness):
    assert harness.call("GET", "/v1/remove")[0] == 405
    assert harness.call("POST", "/v1/state", {})[0] == 405
    assert harness.call("GET", "/v2/state")[0] == 404


def test_state_before_the_agents_wrote_one(harness):
    status, body = harness.call("GET", "/v1/state")
    assert status == 200
    assert body["round"] is None and body["participants"] == [] and body["runId"] == RUN_ID
    assert (body["minNodes"], body["maxNodes"], body["now"]) == (2, 3, T0)
    assert len(body["epoch"]) == 16 and body["failureRounds"] == 0 and body["waiterActive"] is False


def test_state_reflects_what_the_agents_wrote(harness):
    now = datetime.fromtimestamp(T0, UTC)
    state = make_state(round=4, deadline=now + timedelta(seconds=2), participants=[B, A], waiting=[C],
                       redundant=[A2], beats={A: 0, B: 0, C: 0, A2: 0})
    state.last_heartbeats = {A: now - timedelta(seconds=1.5), B: now, C: now - timedelta(seconds=3),
                             A2: now - timedelta(seconds=4)}
    harness.write(state)
    status, body = harness.call("GET", "/v1/state")
    assert status == 200
    assert (body["round"], body["complete"], body["closed"], body["deadlineIn"]) == (4, False, False, 2.0)
    answered = {"stale": False, "unanswered": None}
    assert body["participants"] == [
        {"addr": "10.0.0.2", "pid": 1, "localId": 0, "heartbeatAge": 0.0, **answered, "rank": 0},
        {"addr": "10.0.0.1", "pid": 1, "localId": 0, "heartbeatAge": 1.5, **answered, "rank": 1}]
    assert body["waiting"] == [{"addr": "10.0.0.3", "pid": 1, "localId": 0, "rank": None, "heartbeatAge": 3.0,
                                **answered}]
    assert body["redundant"] == [{"addr": "10.0.0.1", "pid": 7, "localId": 0, "rank": None, "heartbeatAge": 4.0,
                                  **answered}]


def test_remove_through_http_is_remove_node(harness):
    killed = T0 - 2
    state = make_state(round=2, complete=True, participants=[A, B, C])
    state.last_heartbeats[A] = datetime.fromtimestamp(killed - 3, UTC)
    harness.write(state)
    status, body = harness.call("POST", "/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": killed})
    assert status == 200
    assert body["removed"] == [{"addr": "10.0.0.1", "pid": 1, "localId": 0}] and body["refused"] is None
    expected = actions.remove_node(state, "10.0.0.1", datetime.fromtimestamp(killed, UTC), 2).state
    assert fields(harness.stored()) == fields(expected)
    assert any(RUN_ID in line and "remove addr=10.0.0.1" in line for line in harness.lines)


def test_remove_that_would_empty_a_complete_round_is_refused(harness):
    state = make_state(round=2, complete=True, participants=[A], beats={A: 100})
    raw = harness.write(state)
    status, body = harness.call("POST", "/v1/remove", {"addr": "10.0.0.1", "heartbeatBefore": time.time()})
    assert status == 200 and body["removed"] == [] and "would empty complete round 2" in body["refused"]
    assert harness.store.get(harness.key) == raw


def test_complete_through_http_is_complete_round(harness):
    state = make_state(round=3, deadline=datetime.fromtimestamp(T0 + 2, UTC), participants=[A, B])
    harness.write(state)
    assert harness.call("POST", "/v1/complete", {"liveNodes": 3})[1]["completed"] is False
    status, body = harness.call("POST", "/v1/complete", {"liveNodes": 2})
    assert status == 200 and body["completed"] is True and body["changed"] is True
    now = datetime.fromtimestamp(T0, UTC)
    assert fields(harness.stored()) == fields(actions.complete_round(state, 2, 2, 3, now).state)
    # Asked again (a second reconcile before the next answer): done already, nothing changed, no second Event.
    again = harness.call("POST", "/v1/complete", {"liveNodes": 2})[1]
    assert again["completed"] is True and again["changed"] is False


def test_hold_keeps_the_first_rounds_last_call_open_until_its_first_hold_and_seconds(harness):
    harness.write(make_state(round=0, deadline=datetime.fromtimestamp(T0 + 1, UTC), participants=[A]))
    assert harness.call("POST", "/v1/hold", {"round": 1, "seconds": 10})[1]["changed"] is False  # fenced
    status, body = harness.call("POST", "/v1/hold", {"round": 0, "seconds": 10})
    assert status == 200 and body["changed"] is True and body["heldUntil"] == T0 + 10
    assert harness.stored().deadline == datetime.fromtimestamp(T0 + 10, UTC)
    # Asked again later (each reconcile asks): held from the first hold, not pushed on; no second Event.
    harness.clock.now += 5
    again = harness.call("POST", "/v1/hold", {"round": 0, "seconds": 10})[1]
    assert again["changed"] is False and again["heldUntil"] == T0 + 10
    assert harness.call("POST", "/v1/hold", {"round": 0, "seconds": 31})[0] == 400  # past MAX_HOLD
    # complete ends it once every live agent joined; a hold asked after that finds nothing to hold.
    harness.write(make_state(round=0, complete=True, participants=[A, B]))
    assert harness.call("POST", "/v1/hold", {"round": 0, "seconds": 10})[1]["heldUntil"] is None


def test_while_torch_is_checked_the_hold_alone_is_taken_and_only_on_a_torch_in_range(harness):
    harness.write(make_state(round=0, deadline=datetime.fromtimestamp(T0 + 1, UTC), participants=[A]))
    harness.control.verdict = compat.Verdict("2.13.0", False, "checking", checking=True)
    assert harness.call("POST", "/v1/complete", {"liveNodes": 1})[1]["completed"] is False
    held = harness.call("POST", "/v1/hold", {"round": 0, "seconds": 10})[1]
    assert held["changed"] is True, held
    harness.control.verdict = compat.Verdict("2.99.0", False, "checking", checking=True)
    refused = harness.call("POST", "/v1/hold", {"round": 0, "seconds": 20})[1]
    assert refused["changed"] is False and "nudges are off" in refused["reason"]


def test_hold_has_no_last_call_to_hold_before_the_minimum_joined(harness):
    harness.write(make_state(round=0, participants=[A]))  # no deadline: torch waits for its min nodes anyway
    body = harness.call("POST", "/v1/hold", {"round": 0, "seconds": 10})[1]
    assert body["changed"] is False and "no last call yet" in body["reason"]


def test_restart_puts_a_waiter_that_the_poller_takes_out_once_the_round_moved_on(harness):
    harness.write(make_state(round=5, complete=True, participants=[A, B]))
    harness.control.poll()
    assert harness.call("POST", "/v1/restart", {"round": 4})[1]["restarting"] is False  # fenced
    status, body = harness.call("POST", "/v1/restart", {"round": 5})
    assert status == 200 and body["restarting"] is True
    assert actions.has_waiter(harness.stored()) and harness.call("GET", "/v1/state")[1]["waiterActive"]
    assert harness.call("GET", "/v1/state")[1]["waiting"] == []  # the waiter is not shown as a node
    harness.control.poll()
    assert actions.has_waiter(harness.stored()), "taken out before the round moved on"
    # The agents left round 5 (it emptied: round 6, not complete), keeping the waiter they found.
    moved = make_state(round=6, participants=[A])
    moved.wait_list.add(actions.WAITER)
    moved.last_heartbeats[actions.WAITER] = datetime.fromtimestamp(T0, UTC)
    harness.write(moved)
    harness.control.poll()
    assert not actions.has_waiter(harness.stored())
    # The round the restart caused re-forms with the same nodes, and is not a failure.
    harness.write(make_state(round=6, complete=True, participants=[A, B]))
    harness.control.poll()
    assert harness.call("GET", "/v1/state")[1]["failureRounds"] == 0
    harness.write(make_state(round=7, complete=True, participants=[A, B]))
    harness.control.poll()
    _, body = harness.call("GET", "/v1/state")
    assert body["failureRounds"] == 1 and body["lastFailureRoundAt"] == T0
    assert [(r["round"], r["nodes"]) for r in body["rounds"]] == [
        (5, ["10.0.0.1", "10.0.0.2"]), (6, ["10.0.0.1", "10.0.0.2"]), (7, ["10.0.0.1", "10.0.0.2"])]


def test_a_waiter_the_agents_ignore_is_taken_out_after_its_ttl(harness):
    harness.write(make_state(round=5, complete=True, participants=[A, B]))
    harness.call("POST", "/v1/restart", {"round": 5})
    harness.clock.now += 16
    harness.control.poll()
    assert not actions.has_waiter(harness.stored())


def test_a_lost_race_is_redone_on_the_agents_write(harness):
    """An agent's heartbeat lands between our read and our compare_set: it must survive our write."""
    old = datetime.fromtimestamp(T0 - 100, UTC)
    state = make_state(round=2, complete=True, participants=[A, B, C])
    state.last_heartbeats[A] = old
    harness.write(state)
    beat = datetime.fromtimestamp(T0 + 1, UTC)
    real_compare_set = harness.store.compare_set
    raced = []

    class RacingStore:
        def check(self, keys):
            return harness.store.check(keys)

        def get(self, key):
            return harness.store.get(key)

        def compare_set(self, key, expected, desired):
            if not raced:
                raced.append(True)
                agent_state = decode(harness.store.get(key))
                agent_state.last_heartbeats[B] = beat
                harness.write(agent_state)
            return real_compare_set(key, expected, desired)

    control = Control(RacingStore(), RUN_ID, 2, 3, clock=harness.clock, log=lambda line: None)
    outcome = control.remove("10.0.0.1", T0 - 10)
    assert raced and outcome.done
    stored = harness.stored()
    assert A not in stored.participants and stored.last_heartbeats[B] == beat


def test_a_hostile_state_is_reported_not_run(harness, tmp_path):
    class Run:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'pwned'}",)

    raw = base64.b64encode(pickle.dumps(Run()))
    assert harness.store.compare_set(harness.key, "", raw) == raw
    status, body = harness.call("GET", "/v1/state")
    assert status == 500 and "rendezvous state refused" in body["error"] and "posix.system" in body["error"]
    assert harness.call("POST", "/v1/complete", {"liveNodes": 2})[0] == 500
    harness.control.poll()  # replaced by an open round: every agent that synced would fail on it
    assert harness.call("GET", "/v1/state")[0] == 200 and not (tmp_path / "pwned").exists()
    assert harness.call("GET", "/healthz", token=None) == (200, "ok")
    assert not (tmp_path / "pwned").exists()


def test_the_package_never_imports_the_operator():
    code = ("import sys, elasticjob_store.main, elasticjob_store.server, elasticjob_store.control\n"
            "leaked = [m for m in sys.modules if m == 'elasticjob' or m.startswith('elasticjob.')]\n"
            "assert not leaked, leaked\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr



def test_python_m_elasticjob_store_as_the_pod_runs_it(tmp_path):
    env = {**os.environ, "ELASTICJOB_RDZV_RUN_ID": RUN_ID, "ELASTICJOB_RDZV_MIN_NODES": "1",
           "ELASTICJOB_RDZV_MAX_NODES": "3", "ELASTICJOB_RDZV_TOKEN_SHA256": DIGEST}

    def state(port, token):
        conn = http.client.HTTPConnection("127.0.0.1", control_port(port), timeout=2)
        conn.request("GET", "/v1/state", headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read()

    log = tmp_path / "store.log"
    proc, port = start_store_process([sys.executable, "-m", "elasticjob_store"], env, log,
                                     lambda port: state(port, TOKEN)[0] == 200, start_new_session=True)
    try:
        body = state(port, TOKEN)[1]
        assert json.loads(body)["round"] is None and json.loads(body)["maxNodes"] == 3
        assert state(port, "wrong")[0] == 401
        # The agents' store answers on the port itself.
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("hello", "world")
        assert client.get("hello") == b"world"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    output = log.read_text()
    assert proc.returncode == 0, output
    assert f"listening on port {port} (the job's pods only), control on {control_port(port)}" in output
    serving = re.search(r"serving (\d+\.\d\d) s after its process started", output)
    assert serving and 0 < float(serving[1]) < 60, output  # a measure (docs/benchmarks.md), not a target here
    assert "rendezvous store stopping" in output


@pytest.mark.parametrize("env, message", [
    ({}, "ELASTICJOB_RDZV_PORT is required"),
    ({"ELASTICJOB_RDZV_PORT": "x"}, "not an integer"),
    ({"ELASTICJOB_RDZV_PORT": "29400"}, "ELASTICJOB_RDZV_RUN_ID is required"),
    ({"ELASTICJOB_RDZV_PORT": "29400", "ELASTICJOB_RDZV_RUN_ID": "r", "ELASTICJOB_RDZV_MIN_NODES": "3",
      "ELASTICJOB_RDZV_MAX_NODES": "2"}, "outside 3.."),
])
def test_bad_configuration_exits_2_with_a_message(env, message):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICJOB_RDZV_")}
    result = subprocess.run([sys.executable, "-m", "elasticjob_store"], env={**clean, **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr


@contextlib.contextmanager
def _holding_one_of_two_ports(taken: int) -> Iterator[int]:
    """A store port whose pair (port, port + 1) has exactly `port + taken` held by us and the other free.

    A random held port's neighbour may belong to another test's process (a CI run failed on that), so
    the neighbour is probed and another pair tried until one is free.
    """
    for _ in range(50):
        with socket.socket() as holder:
            holder.bind(("", 0))
            holder.listen()
            port = holder.getsockname()[1] - taken
            if _free(port + 1 - taken):
                yield port
                return
    raise AssertionError("no pair of adjacent ports with one free in 50 tries")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("taken", [0, 1])
def test_a_port_taken_exits_1_naming_it(taken):
    """The store's port or its control endpoint's, held by another process: one line, no traceback."""
    with _holding_one_of_two_ports(taken) as port:
        env = {**os.environ, "ELASTICJOB_RDZV_PORT": str(port), "ELASTICJOB_RDZV_RUN_ID": RUN_ID}
        result = subprocess.run([sys.executable, "-m", "elasticjob_store"], env=env, capture_output=True,
                                text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on port {port + taken}" in result.stderr and "Traceback" not in result.stderr


# --- long-polls: the operator waits for a change instead of polling every store --------------------------


def poll_in_background(h: Harness) -> threading.Event:
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.02):
            h.control.poll()

    threading.Thread(target=run, daemon=True).start()
    return stop


def test_a_long_poll_answers_when_the_round_changes(harness):
    harness.write(make_state(round=1, complete=True, participants=[A, B], beats={A: 0, B: 0}))
    stop = poll_in_background(harness)
    try:
        first = wait_for(lambda: harness.call("GET", "/v1/state")[1], 5, "a versioned state",
                         until=lambda body: body["round"] == 1 and body["version"] >= 1)
        timer = threading.Timer(0.3, harness.write, [make_state(round=2, complete=True, participants=[A, B, C])])
        timer.start()
        started = time.monotonic()
        status, body = harness.call("GET", f"/v1/state?after={first['version']}&epoch={first['epoch']}&wait=8")
        assert status == 200 and body["round"] == 2 and body["version"] > first["version"]
        assert time.monotonic() - started < 5, "answered at the change, not at the end of the wait"
    finally:
        stop.set()


def test_a_long_poll_without_a_change_waits_and_a_new_epoch_answers_at_once(harness):
    harness.write(make_state(round=1, complete=True, participants=[A, B], beats={A: 0, B: 0}))
    harness.control.poll()
    _, now = harness.call("GET", "/v1/state")
    started = time.monotonic()
    _, same = harness.call("GET", f"/v1/state?after={now['version']}&epoch={now['epoch']}&wait=0.5")
    assert same["version"] == now["version"] and time.monotonic() - started >= 0.5
    started = time.monotonic()
    _, other = harness.call("GET", f"/v1/state?after={now['version']}&epoch=0000&wait=8")
    assert time.monotonic() - started < 2, "a restarted store (another epoch) answers at once"


def test_a_heartbeat_turning_stale_is_a_change(tmp_path):
    h = Harness(tmp_path, Credential(digest=DIGEST))
    h.control.stale_after = 3.0
    try:
        state = make_state(round=1, complete=True, participants=[A, B])
        beat = datetime.fromtimestamp(T0, UTC)  # on the harness clock
        state.last_heartbeats = {A: beat, B: beat}
        h.write(state)
        h.control.poll()
        _, before = h.call("GET", "/v1/state")
        assert [p["stale"] for p in before["participants"]] == [False, False]
        h.clock.now += 1.0  # still fresh: ages are not part of what counts as a change
        h.control.poll()
        assert h.call("GET", "/v1/state")[1]["version"] == before["version"]
        h.clock.now += 5.0  # a missed keep-alive
        h.control.poll()
        _, after = h.call("GET", "/v1/state")
        assert after["version"] > before["version"]
        assert [p["stale"] for p in after["participants"]] == [True, True]
    finally:
        h.server.shutdown()
        h.server.server_close()


@pytest.mark.parametrize("query", ["after=x", "wait=-1", "wait=600", "wait=nan", "after=-5"])
def test_bad_long_poll_parameters_are_refused(harness, query):
    assert harness.call("GET", f"/v1/state?{query}")[0] == 400


def test_connections_past_the_cap_are_closed_unanswered_and_the_slots_come_back(harness, monkeypatch):
    harness.server.max_per_peer = MAX_CONNECTIONS + 1  # the cap in all, from many peers (here one address)
    monkeypatch.setattr(wire, "REQUEST_DEADLINE", 60.0)  # idle ones hold their slots however slow this machine
    idle = [socket.create_connection(("127.0.0.1", harness.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        # Accepted in order after the idle ones, which hold every slot (each waits for a request line).
        with socket.create_connection(("127.0.0.1", harness.port), timeout=10) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                answer = extra.recv(1024)
            except ConnectionResetError:
                answer = b""
            assert answer == b""
    finally:
        for sock in idle:
            sock.close()
    # Closed clients free their threads and slots: the store answers again.
    wait_for(lambda: harness.call("GET", "/v1/state")[0], 10, "the store to answer once the slots are free",
             until=lambda status: status == 200, ignore=(ConnectionError, http.client.HTTPException))


# --- what anyone who reaches the port can hold -------------------------------------------------------------


@pytest.mark.parametrize("short", ["s" * 31, "x"])
def test_tokens_shorter_than_32_bytes_are_refused(tmp_path, short):
    """A short token could be guessed: refused offered against its digest, and in a token file."""
    digest = hashlib.sha256(short.encode()).hexdigest()
    for credential in (Credential(digest=digest), Credential(token_file=str(tmp_path / "t"))):
        (tmp_path / "t").write_text(short)
        h = Harness(tmp_path, credential)
        try:
            assert h.call("GET", "/v1/state", token=short)[0] == 401
            assert not credential.configured() or credential.digest is not None
        finally:
            h.server.shutdown()
            h.server.server_close()


def slow_clients(port: int, count: int) -> list[socket.socket]:
    """Clients that send half a request line and then a byte now and then: never done."""
    held = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /v1/sta")
        held.append(s)
    return held


def closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_one_peer_holds_a_few_connections_and_the_rest_are_closed_at_once(harness):
    held = slow_clients(harness.port, MAX_PER_PEER + 3)
    try:
        extra = held[MAX_PER_PEER:]
        for s in extra:
            s.settimeout(2)
        assert all(closed_by_server(s) for s in extra), "connections past the per-peer cap are closed unanswered"
    finally:
        for s in held:
            s.close()


def test_a_slow_client_is_cut_off_at_the_request_deadline(harness):
    started = time.monotonic()
    held = slow_clients(harness.port, MAX_PER_PEER)
    try:
        for s in held:
            s.settimeout(REQUEST_DEADLINE + 5)
            assert closed_by_server(s)
        # Well before the handler's 10 s receive timeout would have ended them; no trickle of bytes resets it.
        assert time.monotonic() - started < REQUEST_DEADLINE + 3
    finally:
        for s in held:
            s.close()
    # The server counts a peer's connection until its handler has finished closing it, a moment after the client
    # saw the close: the operator gets in again once those are done.
    assert wait_for(lambda: answer(harness), 5, "the operator let in again", until=lambda status: status == 200)


def answer(harness) -> int | None:
    """The status of one GET of the state, or None when the server closed the connection unanswered."""
    try:
        return harness.call("GET", "/v1/state")[0]
    except (http.client.RemoteDisconnected, ConnectionError):
        return None
