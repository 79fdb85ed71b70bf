"""Warm spares' seats: the store's table (elasticjob_store/seats.py), its reading of the agents' asks from a real
TCPStore (Control.read_seats), and the agent's wait for a seat (elasticjob_warm/seat.py) against the same store."""

from __future__ import annotations

import base64
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from store_states import agent_pickle, make_state

from elasticjob_store import peers, seats
from elasticjob_store.control import Control
from elasticjob_store.state import NodeDesc, state_key
from elasticjob_warm import seat
from helpers import wait_for

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def test_the_agent_and_the_store_name_the_same_keys():
    assert (seat.COUNT_KEY, seat.ASK_PREFIX, seat.HELD_KEY) == (seats.COUNT_KEY, seats.ASK_PREFIX, seats.HELD_KEY)
    assert seat.ASK_EVERY == seats.ASK_EVERY


def test_the_agent_reads_the_list_the_store_writes():
    assert seat.read_held(seats.held_wire(2, [B, A], "e1")) == ("e1", 2, (A, B))
    assert seat.read_held(seats.held_wire(None, [], "e1")) == ("e1", None, ())


def granted(table: seats.Seats, asks: list[str], in_state: set[str] | None, now: float,
            connected: set[str] | None = None) -> list[str]:
    for addr in asks:
        table.asked(addr, now)
    return table.update(in_state, connected, now)


def test_seats_go_to_the_spares_that_asked_first_up_to_the_count():
    table = seats.Seats(2)
    table.asked(C, 0.0)
    assert granted(table, [B, A], set(), 1.0) == [C, A]  # C first; A and B asked together: by address
    assert sorted(table.held) == [A, C] and list(table.waiting) == [B]
    assert granted(table, [B], {A, C}, 2.0) == []


def test_a_holder_that_left_the_state_frees_its_seat_once_its_connection_closed():
    table = seats.Seats(1)
    granted(table, [A, B], set(), 0.0, connected={A, B})
    granted(table, [B], {A}, 1.0, connected={A, B})  # A joined: seen
    assert granted(table, [], set(), 1.1, connected={A, B}) == []  # out of the state, still connected: a rejoin
    assert granted(table, [], set(), 1.2, connected={B}) == [B]  # its pod gone: the spare takes the seat


def test_a_holder_out_of_the_state_past_the_grace_frees_its_seat_though_connected():
    """A cut-off pod: the store dropped its stale heartbeat, but the kernel keeps its connection established."""
    table = seats.Seats(1)
    granted(table, [A, B], set(), 0.0, connected={A, B})
    granted(table, [], {A}, 0.5, connected={A, B})  # A joined
    assert granted(table, [], set(), 1.0, connected={A, B}) == []
    assert granted(table, [], set(), 1.0 + seats.ABSENT_GRACE, connected={A, B}) == [B]


def test_a_survivor_between_two_rounds_keeps_its_seat():
    table = seats.Seats(1)
    granted(table, [A, B], set(), 0.0)
    for now in (10.0, 10.25, 10.5):  # torch's exit op, then its join: out of the state for less than the grace
        assert granted(table, [], set() if now == 10.25 else {A}, now) == []
    assert list(table.held) == [A]


def test_a_seat_granted_to_an_agent_that_never_joins_frees_after_its_ttl():
    table = seats.Seats(1)
    granted(table, [A], set(), 0.0)
    table.asked(B, 1.0)
    assert granted(table, [B], set(), seats.GRANT_TTL - 0.1) == []
    assert granted(table, [B], set(), seats.GRANT_TTL) == [B]


def test_a_spare_that_stops_asking_or_whose_connection_closed_is_forgotten():
    table = seats.Seats(1)
    granted(table, [A, B, C], {A}, 0.0, connected={A, B, C})
    assert set(table.waiting) == {B, C}
    table.update({A}, {A, B}, 1.0)  # C's pod went
    assert set(table.waiting) == {B}
    table.update({A}, {A, B}, seats.ASK_TTL + 0.1)  # B stopped asking
    assert table.waiting == {}


def test_an_address_never_seen_connected_is_not_taken_for_gone():
    """A network that rewrites the agents' addresses: the table never shows them, the state and the asks say."""
    table = seats.Seats(1)
    granted(table, [A, B], {A}, 0.0, connected={"10.9.9.9"})
    assert set(table.waiting) == {B}
    assert list(table.held) == [A]


def test_an_unreadable_state_frees_a_seat_only_on_a_closed_connection():
    table = seats.Seats(1)
    granted(table, [A, B], None, 0.0, connected={A, B})
    assert granted(table, [B], None, 60.0, connected={A, B}) == []  # no GRANT_TTL: it may be in, unseen
    assert granted(table, [B], None, 61.0, connected={B}) == [B]


def test_without_seats_nothing_is_granted_or_kept():
    table = seats.Seats(None)
    assert granted(table, [A], set(), 0.0) == [] and table.waiting == {} and table.describe() is None


@pytest.mark.parametrize("value, cursor, read", [
    (3, 0, [1, 2, 3]),
    (0, 5, []),  # a count written back: read on from there
    (10_000, 0, []),  # forged far ahead: skipped
    (1000, 0, list(range(1, seats.MAX_SLOTS + 1))),  # a burst: at most MAX_SLOTS a tick
])
def test_slots_read_from_the_count(value, cursor, read):
    table = seats.Seats(1)
    table.cursor = cursor
    assert list(table.slots(value)) == read


@pytest.mark.parametrize("raw, found", [
    (b"10.0.0.1", "10.0.0.1"),
    (b" 10.0.0.1\n", "10.0.0.1"),
    (b"0:0:0:0:0:0:0:1", "::1"),
    (b"pod-a", None),
    (b"\xff", None),
    (b"1" * 100, None),
])
def test_an_ask_must_hold_an_ip_address(raw, found):
    assert seats.address(raw) == found


@pytest.mark.parametrize("raw", [b"", b"[]", b'{"v": 2, "epoch": "e", "count": 1, "held": []}',
                                 b'{"v": 1, "epoch": "e", "count": "1", "held": []}',
                                 b'{"v": 1, "epoch": "e", "count": 1, "held": [1]}', b"\xff"])
def test_the_agent_reads_no_seat_list_from_anything_else(raw):
    assert seat.read_held(raw) is None


# ---------------------------------------------------------------- the store and the agent, over a real TCPStore


@pytest.fixture
def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


def client(tcp_store):
    return dist.TCPStore("127.0.0.1", tcp_store.port, is_master=False, timeout=timedelta(seconds=10))


def put_state(tcp_store, *addrs: str) -> None:
    state = make_state(round=1, complete=True, participants=tuple(NodeDesc(a, 1, 0) for a in addrs))
    tcp_store.set(state_key("run-1"), base64.b64encode(agent_pickle(state)))


class Waiting:
    """An agent's wait for a seat, in a thread."""

    def __init__(self, tcp_store, addr: str) -> None:
        self.why: list[str] = []
        self.wait = seat.SeatWait(client(tcp_store), addr)
        self.thread = threading.Thread(target=lambda: self.why.append(self.wait.run()), daemon=True)
        self.thread.start()


def test_a_spare_joins_once_the_seat_of_a_worker_gone_frees(tcp_store):
    clock = [100.0]
    lines: list[str] = []
    control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lines.append, seat_count=1)
    first = Waiting(tcp_store, A)
    wait_for(lambda: control.poll() or first.why, 10, "the first agent seated", interval=0.05)
    assert first.why == ["seated"]
    put_state(tcp_store, A)
    spare = Waiting(tcp_store, B)
    wait_for(lambda: control.poll() or control.seats.waiting, 10, "the spare's ask read", interval=0.05)
    assert spare.why == [] and control.seats.describe()["spares"] == [B]
    put_state(tcp_store)  # A's pod gone: the store took its node out of the state
    control.poll()
    assert spare.why == [], "a seat freed at once, though its holder may be between two rounds"
    clock[0] += seats.ABSENT_GRACE
    wait_for(lambda: control.poll() or spare.why, 10, "the spare seated", interval=0.05)
    assert spare.why == ["seated"] and control.seats.describe()["joining"] == [B]
    assert any(f"seat granted to the spare at {B}" in line for line in lines), lines


def test_a_store_without_seats_lets_every_agent_join(tcp_store):
    control = Control(tcp_store, "run-1", 1, 3, log=lambda _: None)
    control.poll()
    assert seat.SeatWait(client(tcp_store), A).run() == "the job has no spares"


def test_a_store_that_never_lists_seats_lets_the_agent_join_after_a_while(tcp_store):
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    wait = seat.SeatWait(client(tcp_store), A, clock=lambda: clock[0], sleep=sleep)
    assert wait.run() == "the store lists no seats" and clock[0] >= seat.NO_LIST_AFTER


def test_a_spare_asks_again_in_a_new_store(tcp_store):
    """A store that restarted (a new epoch) has none of the asks the old one read."""
    store = client(tcp_store)
    wait = seat.SeatWait(store, B)
    wait.ask("epoch-1")
    wait.ask("epoch-1")  # within ASK_EVERY: not again
    assert int(store.get(seats.COUNT_KEY)) == 1
    wait.ask("epoch-2")
    assert int(store.get(seats.COUNT_KEY)) == 2 and store.get(seats.ask_key(2)) == B.encode()


def test_a_forming_round_that_holds_every_seat_is_completed_by_the_store(tcp_store):
    """The seats are the job's size: once the forming round's participants hold them all, nobody else may join,
    and the store ends the last call in its tick, without the operator's round trip."""
    from datetime import UTC, datetime

    from elasticjob_store.state import decode

    clock = [datetime.now(UTC).timestamp()]
    control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lambda _: None, seat_count=2)
    agents = [Waiting(tcp_store, addr) for addr in (A, B)]
    wait_for(lambda: control.poll() or all(a.why for a in agents), 10, "both agents seated", interval=0.05)
    far = datetime.fromtimestamp(clock[0] + 60, UTC)
    forming = make_state(round=2, deadline=far, participants=(NodeDesc(A, 1, 0),))
    tcp_store.set(state_key("run-1"), base64.b64encode(agent_pickle(forming)))
    control.poll()
    assert decode(tcp_store.get(state_key("run-1"))).deadline == far, "completed with a seat out"
    both = make_state(round=2, deadline=far, participants=(NodeDesc(A, 1, 0), NodeDesc(B, 1, 0)))
    tcp_store.set(state_key("run-1"), base64.b64encode(agent_pickle(both)))
    control.poll()
    assert decode(tcp_store.get(state_key("run-1"))).deadline.timestamp() < clock[0]


def test_an_agent_the_operator_takes_out_frees_its_seat_at_once(tcp_store):
    """POST /v1/remove of a cut-off agent (its connection still established): its seat goes to the spare in the
    next tick, not ABSENT_GRACE later."""
    clock = [100.0]
    control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lambda _: None, seat_count=1)
    first = Waiting(tcp_store, A)
    wait_for(lambda: control.poll() or first.why, 10, "the first agent seated", interval=0.05)
    put_state(tcp_store, A, C)  # C: another agent, so that A's removal leaves the round a participant
    spare = Waiting(tcp_store, B)
    wait_for(lambda: control.poll() or control.seats.waiting, 10, "the spare's ask read", interval=0.05)
    outcome = control.remove(A, time.time() + 1)  # its heartbeat (a second old) before that
    assert [n.addr for n in outcome.nodes] == [A]
    wait_for(lambda: control.poll() or spare.why, 10, "the spare seated at the same clock", interval=0.05)
    assert spare.why == ["seated"]


def test_the_connection_table_is_read_once_a_tick(tcp_store):
    """The silences, the departures and the seats all look at the kernel's table: one read serves them all."""
    reads: list[int] = []

    def tables() -> peers.Reading:
        reads.append(1)
        return peers.Reading({A}, set())

    control = Control(tcp_store, "run-1", 1, 3, log=lambda _: None, tables=tables, seat_count=1)
    put_state(tcp_store, A)
    control.poll()
    assert len(reads) == 1
