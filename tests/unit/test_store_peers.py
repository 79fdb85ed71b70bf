"""The store removes a node whose agent's connection closed (elasticjob_store/peers.py): the kernel's own
connection table, read while real connections open and close on loopback addresses (127.0.0.2 stands for an
agent's pod IP), and the store's poller on a real TCPStore."""

from __future__ import annotations

import base64
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist
from store_states import agent_pickle, make_state

from elasticjob_store import compat, peers
from elasticjob_store.control import Control
from elasticjob_store.state import NodeDesc, decode, state_key
from helpers import wait_for

AGENT, SILENT, OTHER = NodeDesc("127.0.0.2", 1, 0), NodeDesc("127.0.0.3", 1, 0), NodeDesc("127.0.0.4", 1, 0)


def connect_from(address: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return sock


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def test_the_kernel_table_shows_who_is_connected_to_the_port_and_who_left(listener):
    port = listener.getsockname()[1]
    client = connect_from("127.0.0.2", port)
    accepted, _ = listener.accept()
    assert "127.0.0.2" in peers.read(port).connected
    assert "127.0.0.2" not in peers.read(port + 1).connected
    client.close()
    accepted.close()
    wait_for(lambda: peers.read(port).connected, 5, "the connection gone", until=lambda seen: "127.0.0.2" not in seen)


def test_no_readable_table_is_no_evidence(tmp_path):
    assert peers.read(29400, [tmp_path / "missing"]) is None


@pytest.mark.parametrize("line, port, found", [
    # 127.0.0.2:40000 -> 127.0.0.1:29400, established
    ("0: 0100007F:72D8 0200007F:9C40 01 00000000:00000000 00:00000000 00000000 0 0 1", 29400, {"127.0.0.2"}),
    ("0: 0100007F:72D8 0200007F:9C40 06 00000000:00000000 00:00000000 00000000 0 0 1", 29400, set()),  # TIME_WAIT
    ("0: 0100007F:72D8 0200007F:9C40 01 00000000:00000000 00:00000000 00000000 0 0 1", 29401, set()),
    # tcp6: ::ffff:10.245.1.4 -> the store, as an IPv4 agent on a dual-stack socket shows
    ("0: 0000000000000000FFFF00000100007F:72D8 0000000000000000FFFF00000401F50A:9C40 01 0 0 0 0 0 1", 29400,
     {"10.245.1.4"}),
    ("0: 00000000000000000000000001000000:72D8 00000000000000000000000001000000:9C40 01 0 0 0 0 0 1", 29400,
     {"::1"}),
    ("garbage", 29400, set()),
])
def test_table_lines(line, port, found):
    assert peers.remote_addresses(f"header\n{line}\n", port) == found


def test_only_an_address_seen_connected_is_reported_gone_and_once():
    departures = peers.Departures()
    assert departures.gone(set(), ["10.0.0.1"]) == []  # never seen: a network that rewrites addresses
    assert departures.gone({"10.0.0.1", "10.0.0.9"}, ["10.0.0.1"]) == []
    assert departures.gone({"10.0.0.9"}, ["10.0.0.1"]) == ["10.0.0.1"]
    assert departures.gone({"10.0.0.9"}, ["10.0.0.1"]) == []
    assert departures.gone({"10.0.0.1"}, ["10.0.0.1"]) == []  # a replacement at the same address
    assert departures.gone(set(), ["10.0.0.1"]) == ["10.0.0.1"]


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                           timeout=timedelta(seconds=10))
    key = state_key("run-1")
    state = make_state(round=3, complete=True, participants=(AGENT, SILENT, OTHER))
    server.set(key, base64.b64encode(agent_pickle(state)))
    return server


def test_the_poller_removes_the_node_whose_agent_closed_its_connection(store):
    port = store.port
    lines: list[str] = []
    control = Control(store, "run-1", 1, 3, log=lines.append, tables=lambda: peers.read(port))
    agent, other = connect_from("127.0.0.2", port), connect_from("127.0.0.4", port)
    control.poll()
    assert set(decode(store.get(state_key("run-1"))).participants) == {AGENT, SILENT, OTHER}
    agent.close()

    def participants():
        control.poll()
        return set(decode(store.get(state_key("run-1"))).participants)

    # SILENT never connected (its address is not what the store sees): it stays, for the operator to judge.
    wait_for(participants, 5, "the agent's node removed", until=lambda left: left == {SILENT, OTHER})
    assert any("127.0.0.2 closed its connection" in line for line in lines), lines
    other.close()


def test_without_a_connection_table_nothing_is_removed(store):
    control = Control(store, "run-1", 1, 3, log=lambda _: None, tables=lambda: None)
    control.poll()
    assert len(decode(store.get(state_key("run-1"))).participants) == 3


def test_while_torch_is_checked_the_poller_reads_the_state_but_removes_no_one(store):
    """A new store reads the state while its torch is checked (for the first round's hold), but writes nothing
    of its own accord until the verdict: a closed connection is acted on only after it."""
    seen = [{"127.0.0.2", "127.0.0.4"}]
    control = Control(store, "run-1", 1, 3, log=lambda _: None, tables=lambda: peers.Reading(seen[0], set()),
                      verdict=compat.Verdict("2.13.0", False, "checking", checking=True))
    control.poll()
    seen[0] = {"127.0.0.4"}
    control.poll()
    assert control.read()[1] is not None  # read meanwhile
    assert len(decode(store.get(state_key("run-1"))).participants) == 3
    control.verdict = compat.Verdict("2.13.0", True, "checked")
    seen[0] = {"127.0.0.2", "127.0.0.4"}
    control.poll()
    seen[0] = {"127.0.0.4"}
    control.poll()
    assert set(decode(store.get(state_key("run-1"))).participants) == {SILENT, OTHER}
