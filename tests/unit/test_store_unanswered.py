"""An agent whose kernel stops answering the store's TCP (elasticjob_store/peers.py): the keep-alive set on every
agent connection, the kernel table's counters read, how long an address stays unanswered, and the store's state
showing it, on a real TCPStore behind the real control endpoint, as the operator parses it."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest
import torch.distributed as dist
from store_states import A, B, agent_pickle, make_state

from elasticjob import store_reply
from elasticjob_store import gate, peers
from elasticjob_store.auth import Credential
from elasticjob_store.c10d_server import C10dServer
from elasticjob_store.control import Control
from elasticjob_store.server import make_server
from elasticjob_store.state import state_key
from helpers import wait_for

T0 = 1_900_000_000.0
TOKEN = "s3cret-token-" * 3
# 10.0.0.2:40000 -> 10.0.0.9:29400, established, its timer, retransmissions, uid, probes and inode.
ROW = "0: 0900000A:72D8 0200000A:9C40 01 00000000:00000000 {timer} {retransmits} 0 {probes} 1"


@pytest.mark.parametrize("timer, retransmits, probes, port, found", [
    ("02:00000064", "00000000", "0", 29400, set()),  # keep-alive armed, every probe answered: a live kernel
    ("02:00000064", "00000000", "1", 29400, {"10.0.0.2"}),  # a keep-alive probe out, unanswered
    ("01:00000014", "0000000A", "0", 29400, {"10.0.0.2"}),  # data retransmitted ten times (hex), unacknowledged
    ("02:00000064", "00000000", "3", 29401, set()),  # another port's connection
    ("02:00000064", "00000000", "x", 29400, set()),  # garbage in the column
])
def test_table_lines(timer, retransmits, probes, port, found):
    line = ROW.format(timer=timer, retransmits=retransmits, probes=probes)
    assert peers.unanswered_addresses(f"header\n{line}\n", port) == found
    assert peers.remote_addresses(f"header\n{line}\n", 29400) == {"10.0.0.2"}


def test_no_readable_table_is_no_evidence(tmp_path):
    assert peers.read(29400, [tmp_path / "missing"]) is None


def test_a_connected_live_peer_is_answered():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    peers.probe_idle(accepted)
    reading = peers.read(port)
    assert "127.0.0.1" in reading.connected and "127.0.0.1" not in reading.unanswered
    for sock in (client, accepted, listener):
        sock.close()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def keep_alive_armed(port: int) -> bool:
    """Whether every established connection to local `port` has its keep-alive timer running (column `tr` 02):
    an idle connection without SO_KEEPALIVE has none (00)."""
    rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
    mine = [r for r in rows if r[3] == peers.ESTABLISHED and int(r[1].rpartition(":")[2], 16) == port]
    return bool(mine) and all(r[5].startswith("02:") for r in mine)


@pytest.mark.parametrize("gated", [False, True])
def test_the_store_sets_keep_alive_on_every_agent_connection(gated):
    """Without it the kernel never probes an idle connection, and a cut-off agent's stays 'answered'."""
    server = C10dServer("127.0.0.1", 0, log=lambda _: None).start()
    port = server.port
    if gated:  # the gate on the store's port, the store behind it (elasticjob_store/main.py)
        port = free_port()
        gate.Gate(port, server.port, log=lambda _: None).start()
    try:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        client.set("k", "v")
        wait_for(lambda: keep_alive_armed(port), 5, f"keep-alive on the connections to port {port}")
        del client
    finally:
        server.stop()


def test_an_address_counts_once_unanswered_for_half_a_second_and_no_longer_once_it_answers():
    silences = peers.Silences()
    silences.update({"10.0.0.2"}, T0)
    assert silences.silent(T0 + 0.25) == {}  # one tick: a slow ACK, not yet a cut
    silences.update({"10.0.0.2", "10.0.0.3"}, T0 + 0.5)
    assert silences.silent(T0 + 0.5) == {"10.0.0.2": 0.5}
    silences.update({"10.0.0.3"}, T0 + 0.75)  # 10.0.0.2's kernel ACKed: its counters dropped to 0
    assert silences.silent(T0 + 1.0) == {"10.0.0.3": 0.5}
    silences.update(None, T0 + 1.25)  # no table read: nothing known
    assert silences.silent(T0 + 2.0) == {}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_the_store_shows_the_unanswered_node_and_wakes_the_operator_for_it():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=10))
    now = datetime.fromtimestamp(T0, UTC)
    state = make_state(round=2, complete=True, participants=[A, B], beats={A: 0, B: 0})
    state.last_heartbeats = {A: now, B: now}
    store.set(state_key("run-1"), base64.b64encode(agent_pickle(state)))
    clock, table = Clock(), [set()]
    control = Control(store, "run-1", 1, 3, clock=clock, log=lambda _: None, tables=lambda: peers.Reading(set(), table[0]))
    server = make_server(control, "127.0.0.1", 0, Credential(digest=hashlib.sha256(TOKEN.encode()).hexdigest()))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        control.poll()
        before = control.version
        table[0] = {"10.0.0.2"}
        control.poll()
        clock.now += 0.25
        control.poll()
        assert control.version == before  # a quarter of a second: nothing to wake anyone for
        clock.now += 0.25
        control.poll()
        assert control.version == before + 1
        reply = state_reply(server)
        assert {n["addr"]: n["unanswered"] for n in reply["participants"]} == {"10.0.0.1": None, "10.0.0.2": 0.5}
        view = store_reply.parse_state(json.dumps(reply).encode())  # as the operator reads it
        assert view is not None and {n.addr: n.unanswered for n in view.participants} == {
            "10.0.0.1": None, "10.0.0.2": 0.5}
    finally:
        server.shutdown()
        server.server_close()


def state_reply(server) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", "/v1/state", headers={"Authorization": f"Bearer {TOKEN}"})
    body = json.loads(conn.getresponse().read())
    conn.close()
    return body
