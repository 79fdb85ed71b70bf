"""GET /v1/state's reply written once (elasticjob_store/protocol_state.py): the types the store writes and the
shapes the operator reads them back with are the same fields, and a reply the store writes reads back as written."""

from __future__ import annotations

import json
import typing

import pytest

from elasticjob_store import protocol_state as protocol
from elasticjob_store.protocol_state import SHAPES, StateWire

NODE = {"addr": "10.0.0.7", "pid": 41, "localId": 0, "rank": 0, "heartbeatAge": 0.5, "stale": False,
        "unanswered": 1.25}
MARK = {"step": 30, "at": 1_700_000_010.0}
# Every field of StateWire, none at its default: a field the reading drops or renames does not read back.
FULL: StateWire = {
    "epoch": "ab12", "version": 7, "runId": "run-1", "now": 1_700_000_100.0, "minNodes": 1, "maxNodes": 4,
    "staleAfter": 30.0, "round": 3, "complete": True, "closed": True, "deadlineIn": -2.5,
    "participants": [NODE], "waiting": [{**NODE, "addr": "10.0.0.8", "rank": None, "stale": True}],  # type: ignore[typeddict-item]
    "redundant": [{**NODE, "addr": "10.0.0.9", "rank": None}],  # type: ignore[typeddict-item]
    "failureRounds": 2, "lastFailureRoundAt": 1_700_000_050.0,
    "rounds": [{"round": 3, "nodes": ["10.0.0.7"], "completedAt": 1_700_000_060.0, "formingSince": 1_700_000_055.0}],
    "waiterActive": True,
    "torch": {"version": "2.13.0", "nudges": False, "why": "old", "checking": True,
              "plainTorchrun": {"agents": 2, "why": "no wrapper"}},
    "progress": {"pod": "job-worker-0", "restart": 1, "stepSeconds": 0.2, "listens": True, "interval": 1.0,
                 "startedAt": 1_700_000_000.0, "stepAt": 1_700_000_020.0, "firstStepAt": 1_700_000_001.0,
                 "loadingAt": 1_700_000_000.5, "sentAt": 1_700_000_020.5, "step": 40, "firstStep": 10,
                 "saved": MARK, "loaded": MARK, "stopped": MARK, "receivedAt": 1_700_000_021.0, "stalled": True,
                 "previousPod": "job-worker-1"},  # type: ignore[typeddict-item]
    "stop": {"id": "s1", "step": 50, "at": 1_700_000_030.0},
    "pace": [{"pod": "job-worker-0", "seconds": 0.2, "ranks": 2}],
    "peers": {"checked": True, "told": True, "allowed": ["10.0.0.7"], "refused": 3, "lastRefused": ["10.9.9.9"],
              "held": 1},
    "nodeChecks": [{"addr": "10.0.0.7", "seconds": 4.0, "held": 2.0, "at": 1_700_000_040.0}],
    "links": {"round": 3, "world": 2, "seconds": 0.01, "outlier": "10.0.0.7", "reason": "slow link"},
    "seats": {"count": 2, "held": ["10.0.0.7"], "spares": ["10.0.0.8"], "joining": [], "granted": 5},
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_shape_reads_the_fields_of_its_type(name):
    kind, shape = SHAPES[name]
    assert set(shape) == set(typing.get_type_hints(kind)), name


def test_a_reply_the_store_writes_reads_back_as_written():
    assert set(FULL) == set(typing.get_type_hints(StateWire))
    assert protocol.read_state(json.loads(json.dumps(FULL))) == FULL


def test_a_reply_of_only_an_epoch_reads_with_every_field_at_its_default():
    state = protocol.read_state({"epoch": "ab"})
    assert set(state) == set(FULL)
    assert (state["participants"], state["torch"], state["progress"], state["pace"]) == ([], None, None, [])


@pytest.mark.parametrize("change", [
    {"epoch": "AB"}, {"version": True}, {"participants": [{**NODE, "addr": "pod-a"}]},
    {"rounds": [{"round": 3, "completedAt": float("nan")}]}, {"seats": {"count": 0}}, {"torch": {"nudges": 1}},
])
def test_a_bad_field_the_planner_relies_on_makes_the_reply_unreadable(change):
    with pytest.raises(protocol.Invalid):
        protocol.read_state({**FULL, **change})


def test_the_tenants_own_reports_are_read_one_by_one():
    """A bad progress report or link verdict reads as none, a bad pace or node check is left out: the rest of
    the reply stands."""
    state = protocol.read_state({
        **FULL, "progress": {"step": -1}, "links": {"round": 3}, "pace": [{"pod": "", "seconds": 1, "ranks": 1},
                                                                         FULL["pace"][0]],
        "nodeChecks": [{"addr": "10.0.0.7"}, FULL["nodeChecks"][0]]})
    assert (state["progress"], state["links"]) == (None, None)
    assert (state["pace"], state["nodeChecks"]) == (FULL["pace"], FULL["nodeChecks"])
