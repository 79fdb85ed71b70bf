"""The store's actions on torch's rendezvous state, checked against torch's own code paths where one exists."""

from __future__ import annotations

import copy
import ipaddress
from datetime import datetime, timedelta
from unittest import mock

import pytest
from store_states import A2, NOW, A, B, C, ago, fields, make_state
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _Action,
    _BackendRendezvousStateHolder,
    _RendezvousContext,
    _RendezvousJoinOp,
)

from elasticjob_store.actions import (
    CLOCK_SKEW,
    WAITER,
    add_waiter,
    complete_round,
    has_waiter,
    remove_node,
    remove_waiter,
)
from elasticjob_store.rounds import RoundTracker
from elasticjob_store.state import NodeDesc, encode

MIN, MAX = 2, 3
KILLED_AT = ago(3)  # the moment the operator knows the pod's processes stopped


def settings(min_nodes: int = MIN, max_nodes: int = MAX) -> RendezvousSettings:
    return RendezvousSettings("run", min_nodes, max_nodes, RendezvousTimeout(), timedelta(seconds=2), 3)


class _Frozen(datetime):
    """torch's clock, stopped at the tables' NOW: the tables' heartbeat ages hold however late a test runs."""

    @classmethod
    def now(cls, tz=None):
        return NOW if tz is not None else NOW.replace(tzinfo=None)


def frozen_torch_clock():
    return mock.patch.object(dynamic_rendezvous, "datetime", _Frozen)


def torch_sanitize(state, min_nodes: int = MIN):
    """What the agents' _sanitize does with the same state (dead = heartbeat older than 6 s)."""
    holder = _BackendRendezvousStateHolder(None, settings(min_nodes))
    holder._state = copy.deepcopy(state)
    with frozen_torch_clock():
        holder._sanitize()
    return holder._state


# (name, state, addr, expected: participants, wait_list, complete, round, deadline-cleared, removed nodes)
REMOVALS = [
    ("dead participant of a complete round",
     make_state(round=4, complete=True, participants=[A, B, C], beats={A: 10, B: 1, C: 1}),
     "10.0.0.1", [B, C], set(), True, 4, False, [A]),
    ("in a forming round, still at min: deadline kept",
     make_state(round=2, deadline=NOW, participants=[A, B, C], beats={A: 10, B: 1, C: 1}),
     "10.0.0.1", [B, C], set(), False, 2, False, [A]),
    ("in a forming round, below min: deadline cleared",
     make_state(round=2, deadline=NOW, participants=[A, B], beats={A: 10, B: 1}),
     "10.0.0.1", [B], set(), False, 2, True, [A]),
    ("waiting only",
     make_state(round=1, complete=True, participants=[B, C], waiting=[A], beats={A: 10, B: 1, C: 1}),
     "10.0.0.1", [B, C], set(), True, 1, False, [A]),
    ("redundant only",
     make_state(round=1, complete=True, participants=[B, C], redundant=[A], beats={A: 10, B: 1, C: 1}),
     "10.0.0.1", [B, C], set(), True, 1, False, [A]),
    ("old agent goes, the replacement at the same IP stays",
     make_state(round=1, complete=True, participants=[A, B], waiting=[A2], beats={A: 10, A2: 1, B: 1}),
     "10.0.0.1", [B], {A2}, True, 1, False, [A]),
]


@pytest.mark.parametrize("name, state, addr, participants, waiting, complete, round_, cleared, removed",
                         REMOVALS, ids=[r[0] for r in REMOVALS])
def test_remove_node(name, state, addr, participants, waiting, complete, round_, cleared, removed):
    before = encode(state)
    outcome = remove_node(state, addr, KILLED_AT, MIN)
    assert encode(state) == before, "the input state must not change"
    new = outcome.state
    assert outcome.done and not outcome.refused
    assert list(outcome.nodes) == removed
    assert sorted(new.participants) == participants
    assert new.wait_list == waiting
    assert (new.complete, new.round) == (complete, round_)
    assert (new.deadline is None) == (cleared or state.deadline is None)
    assert set(new.last_heartbeats) == set(state.last_heartbeats) - set(removed)
    # The same result torch's own _sanitize reaches once A's heartbeat expires.
    assert fields(new) == fields(torch_sanitize(state))


def test_removed_participants_ranks_are_left_as_torch_leaves_them():
    state = make_state(round=1, complete=True, participants=[A, B, C], beats={A: 10, B: 1, C: 1})
    assert remove_node(state, "10.0.0.1", KILLED_AT, MIN).state.participants == {B: 1, C: 2}


@pytest.mark.parametrize("state, addr, reason", [
    (make_state(round=1, complete=True, participants=[A, B], beats={A: 1, B: 1}), "10.0.0.1",
     "heartbeat after that time"),
    (make_state(round=1, complete=True, participants=[A, B]), "10.0.0.9", "no node at 10.0.0.9"),
    (None, "10.0.0.1", "no rendezvous state"),
])
def test_remove_node_leaves_live_or_absent_nodes(state, addr, reason):
    outcome = remove_node(state, addr, KILLED_AT, MIN)
    assert (outcome.state, outcome.done, outcome.refused) == (None, False, False)
    assert reason in outcome.reason


@pytest.mark.parametrize("state", [
    make_state(round=5, complete=True, participants=[A], beats={A: 10}),
    # Others waiting do not make it safe: the round itself would be empty without anyone leaving it.
    make_state(round=5, complete=True, participants=[A], waiting=[B], beats={A: 10, B: 1}),
    make_state(round=5, complete=True, participants=[A, A2], beats={A: 10, A2: 10}),
])
@pytest.mark.parametrize("known", [False, True])
def test_remove_node_refuses_to_empty_a_complete_round_no_one_left(state, known):
    # The round's members unknown (a restarted store), or known and every one of them still in it.
    members = tuple(sorted(n.addr for n in state.participants)) if known else None
    outcome = remove_node(state, "10.0.0.1", KILLED_AT, 1, members)
    assert outcome.refused and outcome.state is None and not outcome.done
    assert "would empty complete round 5" in outcome.reason


def test_the_last_member_of_a_round_the_others_left_may_go():
    """Scale-down 2 -> 1: the survivor left round 5 to restart; the departed agent is the last one in it."""
    state = make_state(round=5, complete=True, participants=[A], beats={A: 10})
    outcome = remove_node(state, "10.0.0.1", KILLED_AT, 1, members=("10.0.0.1", "10.0.0.2"))
    assert outcome.done and not outcome.refused
    assert outcome.state.participants == {} and outcome.state.round == 6 and not outcome.state.complete


def test_emptying_a_forming_round_is_allowed():
    state = make_state(round=5, deadline=NOW, participants=[A], beats={A: 10})
    new = remove_node(state, "10.0.0.1", KILLED_AT, 1).state
    assert new.participants == {} and new.deadline is None and new.round == 5


def test_a_node_without_a_heartbeat_is_removed():
    state = make_state(round=1, complete=True, participants=[A, B], beats={B: 1})
    assert list(remove_node(state, "10.0.0.1", KILLED_AT, MIN).nodes) == [A]


def test_ipv6_addresses_match_in_any_spelling():
    v6 = NodeDesc("fd00:0:0:0:0:0:0:1", 1, 0)
    state = make_state(round=1, complete=True, participants=[v6, B], beats={v6: 10, B: 1})
    assert list(remove_node(state, "fd00::1", KILLED_AT, MIN).nodes) == [v6]


def join_action(state, node, min_nodes=MIN, max_nodes=MAX):
    """What torch's join op does next for `node` with this state (far from its own join deadline)."""
    ctx = _RendezvousContext(node, state, settings(min_nodes, max_nodes))
    with frozen_torch_clock():
        return _RendezvousJoinOp()(ctx, float("inf"))


def test_complete_round_makes_the_agents_complete_it():
    # Heartbeats far in the future: torch's join op has nothing to do but decide about completion.
    state = make_state(round=3, deadline=NOW + timedelta(seconds=30), participants=[A, B],
                       beats={A: -1e9, B: -1e9})
    assert join_action(state, A) == _Action.SYNC
    outcome = complete_round(state, 2, MIN, MAX, NOW)
    assert outcome.done and outcome.state.deadline == NOW - CLOCK_SKEW
    assert state.deadline == NOW + timedelta(seconds=30), "the input state must not change"
    assert join_action(outcome.state, A) == _Action.MARK_RENDEZVOUS_COMPLETE


@pytest.mark.parametrize("state, live, reason", [
    (None, 2, "no rendezvous state"),
    (make_state(round=3, complete=True, participants=[A, B]), 2, "already complete"),
    (make_state(round=3, closed=True, participants=[A, B]), 2, "closed"),
    (make_state(round=3, participants=[A]), 1, "fewer than the 2 needed"),
    (make_state(round=3, deadline=NOW, participants=[A, B]), 3, "2 participant(s) but 3 live node(s)"),
    (make_state(round=3, deadline=NOW, participants=[A, B, C, A2]), 4, "more than the 3 allowed"),
])
def test_complete_round_waits_for_every_live_node(state, live, reason):
    outcome = complete_round(state, live, MIN, MAX, NOW)
    assert outcome.state is None and not outcome.done and reason in outcome.reason


def test_complete_round_with_a_past_deadline_writes_nothing():
    state = make_state(round=3, deadline=NOW - 2 * CLOCK_SKEW, participants=[A, B])
    outcome = complete_round(state, 2, MIN, MAX, NOW)
    assert outcome.done and outcome.state is None


def test_waiter_makes_running_agents_restart_and_expires_like_a_node():
    state = make_state(round=7, complete=True, participants=[A, B])
    now = NOW
    outcome = add_waiter(state, 7, now)
    assert outcome.done and has_waiter(outcome.state) and not has_waiter(state)
    # num_nodes_waiting() is len(wait_list): the agents restart their workers.
    assert len(outcome.state.wait_list) == 1 and outcome.state.last_heartbeats[WAITER] == now
    # torch's _sanitize keeps it while its heartbeat is fresh, and drops it after the keep-alive window.
    assert WAITER in torch_sanitize(outcome.state).wait_list
    stale = copy.deepcopy(outcome.state)
    stale.last_heartbeats[WAITER] = now - timedelta(seconds=7)
    assert WAITER not in torch_sanitize(stale).wait_list


@pytest.mark.parametrize("state, round_seen, reason", [
    (None, 0, "no rendezvous state"),
    (make_state(round=7, complete=True, participants=[A, B]), 6, "the round is 7, not 6"),
    (make_state(round=7, participants=[A, B]), 7, "not complete"),
    (make_state(round=7, complete=True, closed=True, participants=[A, B]), 7, "closed"),
])
def test_add_waiter_is_fenced_by_the_round(state, round_seen, reason):
    outcome = add_waiter(state, round_seen, NOW)
    assert outcome.state is None and not outcome.done and reason in outcome.reason


def test_add_waiter_twice_writes_once():
    state = add_waiter(make_state(round=7, complete=True, participants=[A, B]), 7, NOW).state
    outcome = add_waiter(state, 7, NOW)
    assert outcome.done and outcome.state is None


def test_remove_waiter():
    with_waiter = add_waiter(make_state(round=7, complete=True, participants=[A, B]), 7, NOW).state
    outcome = remove_waiter(with_waiter)
    assert outcome.done and not has_waiter(outcome.state) and WAITER not in outcome.state.last_heartbeats
    assert has_waiter(with_waiter)
    assert remove_waiter(outcome.state).state is None


def test_waiter_is_no_pod_address():
    with pytest.raises(ValueError):
        ipaddress.ip_address(WAITER.addr)


def completed(round_, *nodes, **kw):
    return make_state(round=round_, complete=True, participants=list(nodes), **kw)


def test_round_tracker_counts_failures_not_membership_changes():
    tracker = RoundTracker()
    steps = [  # (state, now, recorded?, failure?)
        (make_state(round=0, participants=[A]), 1.0, False, False),  # forming: nothing yet
        (completed(0, A, B), 2.0, True, False),  # the first round is no failure
        (completed(0, A, B), 3.0, False, False),  # seen again
        (make_state(round=1, participants=[B]), 4.0, False, False),
        (completed(1, B, A), 5.0, True, True),  # same nodes again: a worker failed
        (completed(2, A, B, C), 6.0, True, False),  # C joined
        (completed(3, A, B), 7.0, True, False),  # C left
        (completed(4, A2, B), 8.0, True, True),  # another agent at A's address: still the same nodes
    ]
    for state, now, recorded, failure in steps:
        got = tracker.track(state, now)
        assert (got is not None) == recorded, (state.round, now)
        if got is not None:
            assert got.failure == failure and got.completed_at == now
    assert tracker.failure_rounds == 2 and tracker.last_failure_at == 8.0
    assert [(r.round, r.nodes) for r in tracker.rounds][:2] == [(0, ("10.0.0.1", "10.0.0.2")),
                                                               (1, ("10.0.0.1", "10.0.0.2"))]


def test_a_round_says_when_the_round_before_it_began_to_break_up():
    tracker = RoundTracker()
    assert tracker.track(make_state(round=0, participants=[A]), 1.0) is None
    assert tracker.track(completed(0, A, B), 2.0).forming_since == 1.0, "the first round: first seen forming"
    assert tracker.track(completed(0, A, B, waiting=[C]), 3.0) is None  # C waits: the round still trains
    assert tracker.track(completed(0, B), 4.0) is None  # A left it to re-form: its workers stopped by now
    assert tracker.track(make_state(round=1, participants=[A]), 4.25) is None
    assert tracker.track(completed(1, A, B, C), 5.0).forming_since == 4.0
    assert tracker.track(completed(2, A, B), 6.0).forming_since is None, "formed between two polls: not seen"


def test_round_tracker_does_not_charge_the_stores_own_restart():
    tracker = RoundTracker()
    tracker.track(completed(3, A, B), 1.0)
    tracker.note_restart(3)
    assert not tracker.track(completed(4, A, B), 2.0).failure
    assert tracker.track(completed(5, A, B), 3.0).failure  # the next one is a failure again
    assert tracker.failure_rounds == 1


def test_round_tracker_ignores_rounds_that_go_back():
    # Two states written in turn (a stale agent, or anyone who can reach the store) must charge nothing.
    tracker = RoundTracker()
    tracker.track(completed(5, A, B), 1.0)
    for poll in range(6):
        tracker.track(completed(4, A, B) if poll % 2 else completed(5, A, B), 2.0 + poll)
    assert tracker.failure_rounds == 0 and [r.round for r in tracker.rounds] == [5]
    assert tracker.track(completed(6, A, B), 9.0).failure  # a real next round still counts
    assert tracker.failure_rounds == 1


def test_round_tracker_keeps_the_last_ten():
    tracker = RoundTracker()
    for i in range(15):
        tracker.track(completed(i, A, B) if i % 2 else completed(i, A, B, C), float(i))
    assert [r.round for r in tracker.rounds] == list(range(5, 15))
    assert tracker.failure_rounds == 0
