"""The store's gate (elasticjob_store/gate.py) in front of a real TCPStore on the loopback, dialled by torch's own
TCPStore client from this machine's non-loopback address (a peer that is not the store pod's own process)."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from elasticjob_store import gate, protocol
from elasticjob_store.gate import Gate


def outside_address() -> str:
    """An address of this machine that is not the loopback: dialling it from here is a peer's connection."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.123", 9))  # no packet is sent: it only picks the route's source address
        address = probe.getsockname()[0]
    except OSError:
        address = ""
    finally:
        probe.close()
    if not address or address.startswith("127."):
        pytest.skip("this machine has no address but the loopback to dial the gate from")
    return address


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fenced() -> Any:
    inner = gate.inner_socket()
    master = dist.TCPStore("127.0.0.1", inner.getsockname()[1], is_master=True, wait_for_workers=False,
                           multi_tenant=True, master_listen_fd=inner.fileno(), timeout=timedelta(seconds=5))
    lines: list[str] = []
    fence = Gate(free_port(), inner.getsockname()[1], hold=0.5, log=lines.append)
    fence.start()
    yield fence, master, lines


def client(address: str, port: int, seconds: float = 3.0) -> Any:
    return dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=seconds))


def wait_until(check: Any, deadline: float = 5.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.01)


def test_a_peer_the_operator_never_named_is_refused_and_writes_nothing(fenced: Any) -> None:
    fence, master, lines = fenced
    with pytest.raises(Exception):  # noqa: B017 - torch's DistNetworkError or its RuntimeError
        client(outside_address(), fence.port, seconds=2).set("torch.rendezvous.x", b"closed")
    assert not master.check(["torch.rendezvous.x"])
    assert fence.report()["refused"] >= 1
    assert outside_address() in fence.report()["lastRefused"]
    assert any("has not yet said which pods" in line for line in lines)


def test_a_named_peer_passes_both_ways(fenced: Any) -> None:
    fence, master, _ = fenced
    assert fence.allow([outside_address()])
    peer = client(outside_address(), fence.port)
    peer.set("k", b"v")
    assert master.get("k") == b"v"
    master.set("back", b"w")
    assert peer.get("back") == b"w"
    assert peer.add("n", 2) == 2
    assert not fence.allow([outside_address()])  # the same list again changes nothing
    assert fence.report()["refused"] == 0


def test_a_peer_that_dials_before_it_is_named_is_held_and_then_passed(fenced: Any) -> None:
    fence, master, _ = fenced
    fence.hold = 10.0
    done: list[Any] = []

    def dial() -> None:
        try:
            store = client(outside_address(), fence.port, seconds=10)
            store.set("early", b"1")
            done.append(True)
        except Exception as err:  # noqa: BLE001 - reported below
            done.append(err)

    thread = threading.Thread(target=dial)
    thread.start()
    wait_until(lambda: fence.report()["held"] == 1)
    assert not master.check(["early"])
    fence.allow([outside_address()])
    thread.join(10)
    assert done == [True]
    assert master.get("early") == b"1"


def test_an_address_taken_off_the_list_loses_its_connections_at_once(fenced: Any) -> None:
    fence, master, _ = fenced
    fence.allow([outside_address()])
    peer = client(outside_address(), fence.port)
    peer.set("before", b"1")
    fence.allow([])
    with pytest.raises(Exception):  # noqa: B017 - the connection was closed under it (add waits for a reply)
        peer.add("after", 1)
    assert not master.check(["after"])


def test_the_loopback_always_passes(fenced: Any) -> None:
    fence, master, _ = fenced
    client("127.0.0.1", fence.port).set("own", b"1")
    assert master.get("own") == b"1"


def test_a_stranger_holds_at_most_a_few_connections(fenced: Any) -> None:
    fence, _, _ = fenced
    fence.hold = 10.0
    socks = [socket.create_connection((outside_address(), fence.port)) for _ in range(gate.MAX_HELD_PER_ADDRESS + 3)]
    try:
        wait_until(lambda: fence.report()["held"] == gate.MAX_HELD_PER_ADDRESS)
        wait_until(lambda: fence.report()["refused"] == 3)
    finally:
        for sock in socks:
            sock.close()


def test_the_operators_request_is_checked_and_applied() -> None:
    route = gate.peers_route(None)
    assert route({"addresses": ["10.0.0.1"]}, {})["changed"] is False
    fence = Gate(0, 0)
    route = gate.peers_route(fence)
    reply = protocol.Peers.reply(route({"addresses": ["::ffff:10.0.0.2", "10.0.0.1", "10.0.0.1"]}, {}))
    assert reply.changed and reply.allowed == 2
    assert fence.report()["allowed"] == ["10.0.0.1", "10.0.0.2"]
    for bad in ({"addresses": ["not-an-ip"]}, {"addresses": "10.0.0.1"}, {"addresses": ["10.0.0.1"] * 5000},
                {"addresses": [], "more": 1}):
        with pytest.raises(protocol.Invalid):
            route(bad, {})


def test_an_address_taken_off_the_list_is_refused_at_once_not_held(fenced: Any) -> None:
    """A pod deleted at once runs on for its grace period; its agent dialling to ask for a stop is refused at
    once (its workers then stop and save while they can), not held for the hold as an unnamed pod would be."""
    fence, master, _ = fenced
    fence.hold = 10.0
    fence.allow([outside_address()])
    client(outside_address(), fence.port).set("k", b"v")
    fence.allow([])
    started = time.monotonic()
    with socket.create_connection((outside_address(), fence.port), timeout=2) as sock:
        sock.settimeout(2)
        try:
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass
    assert time.monotonic() - started < 1.0
    assert fence.report()["held"] == 0
    fence.allow([outside_address()])  # the operator names it again (a new pod got the address): it passes
    client(outside_address(), fence.port).set("again", b"v")
    assert master.get("again") == b"v"


def test_the_agents_probe_tells_a_refusal_from_a_store_that_passes_it(fenced: Any) -> None:
    """elasticjob_warm.evicted.probe, where no NetworkPolicy drops the deleted pod's connections: the gate's
    refusal raises at once; a passed connection (open and silent) does not."""
    from elasticjob_warm import evicted

    fence, _, _ = fenced
    fence.allow([outside_address()])
    evicted.probe(outside_address(), fence.port)
    fence.allow([])
    started = time.monotonic()
    with pytest.raises(OSError):
        evicted.probe(outside_address(), fence.port)
    assert time.monotonic() - started < 1.0
