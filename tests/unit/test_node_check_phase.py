"""The node check's cost as its own phase of the ledger: the agent writes what its check held its join
(elasticjob_warm/nodecheck.py) into a real TCPStore, the store reads it for the latest round's members
(elasticjob_store/nodechecks.py), the operator parses the reply, and the ledger takes the longest hold after the
fault out of the rendezvous phase (planner/ledger.py, planner/goodput.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import torch.distributed as dist
from store_states import A, B, make_state

from elasticjob import store_reply
from elasticjob.observe import NodeCheckView, StoreNode, StoreView
from elasticjob.planner import goodput, ledger
from elasticjob_store import nodechecks
from elasticjob_store.control import Control
from elasticjob_store.report import describe
from elasticjob_warm import nodecheck
from helpers import wait_for

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


def test_the_agent_and_the_store_name_the_same_keys():
    assert nodecheck.KEY_PREFIX == nodechecks.KEY_PREFIX


def test_the_agents_report_reaches_the_store_in_the_background(tcp_store):
    thread = nodecheck.report_later(f"127.0.0.1:{tcp_store.port}", "10.0.0.1", 0.42, 0.3)
    assert thread is not None
    thread.join(10)
    raw = wait_for(lambda: tcp_store.get(nodechecks.key("10.0.0.1")) if tcp_store.check(
        [nodechecks.key("10.0.0.1")]) else None, 10, "the node check's report")
    found = nodechecks.check(raw)
    assert found is not None and (found["seconds"], found["held"]) == (0.42, 0.3)


def test_no_store_or_no_address_writes_nothing():
    assert nodecheck.report_later(None, "10.0.0.1", 0.1, 0.1) is None
    assert nodecheck.report_later("127.0.0.1:1", None, 0.1, 0.1) is None


@pytest.mark.parametrize("raw, why", [
    (b'{"v": 1, "seconds": 0.4, "held": 0.3}', "no time"),
    (b'{"v": 1, "seconds": 0.4, "held": -1, "at": 1.0}', "a negative hold"),
    (b'{"v": 1, "seconds": 0.4, "held": 1e9, "at": 1.0}', "a hold past any budget"),
    (b'{"v": 1, "seconds": "0.4", "held": 0.3, "at": 1.0}', "a string"),
    (b'{"v": 1, "seconds": true, "held": 0.3, "at": 1.0}', "a bool"),
    (b'{"v": 2, "seconds": 0.4, "held": 0.3, "at": 1.0}', "another version"),
    (b'{"v": 1, "seconds": 0.4, "held": 0.3, "at": 1.0, "x": "' + b"a" * 300 + b'"}', "too long"),
    (b"\x80not json", "not JSON"),
])
def test_the_store_refuses_a_report_with_any_field_wrong(raw, why):
    assert nodechecks.check(raw) is None, why


def test_the_store_reads_the_rounds_members_and_wakes_the_operator_when_one_reports(tcp_store):
    clock = [1_900_000_000.0]
    control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lambda _line: None)
    control.tracker.track(make_state(round=1, complete=True, participants=(A, B)), clock[0])
    tcp_store.set(nodechecks.key(A.addr), nodecheck.report_body(0.2, 0.1, clock[0] - 5))
    tcp_store.set(nodechecks.key("10.9.9.9"), nodecheck.report_body(9.0, 9.0, clock[0]))  # not a member
    control.read_agents(None, clock[0])
    assert [c["addr"] for c in control.node_checks.describe()] == [A.addr]
    before = control.node_checks.landmark()
    tcp_store.set(nodechecks.key(B.addr), nodecheck.report_body(0.6, 0.5, clock[0]))
    clock[0] += 0.25
    control.read_agents(None, clock[0])
    assert control.node_checks.landmark() == before, "read every 2 s, not at each tick"
    clock[0] += nodechecks.READ_EVERY
    control.read_agents(None, clock[0])
    assert control.node_checks.landmark() != before
    body = describe(None, control.tracker, now=clock[0], epoch="ab", run_id="run-1", min_nodes=1, max_nodes=3,
                    node_checks=control.node_checks.describe())
    view = store_reply.parse_state(json.dumps(body).encode())
    assert view is not None and [(c.addr, c.held) for c in view.node_checks] == [(A.addr, 0.1), (B.addr, 0.5)]


def test_the_operator_leaves_out_a_node_check_out_of_range_but_keeps_the_reply():
    reply = {"epoch": "ab12", "round": 1, "complete": True,
             "nodeChecks": [{"addr": "10.0.0.1", "held": -1, "at": 1.0}, {"addr": "10.0.0.2", "held": 0.5, "at": 1.0},
                            "x"]}
    view = store_reply.parse_state(json.dumps(reply).encode())
    assert view is not None and [c.addr for c in view.node_checks] == ["10.0.0.2"]


def store(*checks: NodeCheckView, members: tuple[str, ...] = ("10.0.0.1", "10.0.0.2")) -> StoreView:
    return StoreView(epoch="e1", round=2, complete=True, participants=tuple(StoreNode(a, 0.5) for a in members),
                     last_round_nodes=members, node_checks=checks)


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


@pytest.mark.parametrize("view, checking, expected", [
    pytest.param(store(), False, 0.0, id="no-check-runs:-nothing-held"),
    pytest.param(None, True, None, id="no-store:-unknown"),
    pytest.param(store(NodeCheckView("10.0.0.1", 0.4, at(-60))), True, None, id="a-member-has-not-said:-unknown"),
    pytest.param(store(NodeCheckView("10.0.0.1", 0.4, at(-60)), NodeCheckView("10.0.0.2", 0.7, at(-50))), True, 0.0,
                 id="both-restarted-in-place:-0"),
    pytest.param(store(NodeCheckView("10.0.0.1", 0.4, at(-60)), NodeCheckView("10.0.0.2", 0.7, at(3))), True, 0.7,
                 id="the-replacement-held-its-join"),
    pytest.param(store(NodeCheckView("10.0.0.1", 1.1, at(2)), NodeCheckView("10.0.0.2", 0.7, at(3))), True, 1.1,
                 id="the-longest-of-two-newcomers"),
])
def test_the_hold_is_the_longest_among_the_agents_that_checked_after_the_fault(view, checking, expected):
    assert ledger.node_check_held(view, checking, START) == expected


@pytest.mark.parametrize("rendezvous, held, expected", [
    (1.0, None, (None, 1.0)),
    (None, 0.5, (None, None)),
    (1.0, 0.4, (0.4, 0.6)),
    (1.0, 2.5, (1.0, 0.0)),  # never more than the rendezvous phase: the phases still add up
    (0.0, 0.3, (0.0, 0.0)),
])
def test_the_check_is_taken_out_of_the_rendezvous_phase(rendezvous, held, expected):
    assert goodput.split_node_check(rendezvous, held) == expected


def test_the_phases_still_add_up_to_the_time_from_the_fault_to_the_first_step():
    marks = goodput.Marks(start=at(0), detected=at(0.5), replaced=at(2.5), round=at(3.5), first_step=at(4.0),
                          node_check=0.6)
    found = goodput.phases(marks)
    assert (found.node_check, found.rendezvous) == (0.6, 0.4)
    assert goodput.lost(found) == 4.0
