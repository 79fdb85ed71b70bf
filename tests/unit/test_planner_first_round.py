"""The first round waits for the job's workers still starting (planner/first_round.py), and for no one else."""

from __future__ import annotations

import dataclasses

import pytest
from factory import NOW, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.observe import StoreNode, StoreView

IP = [f"10.244.0.{10 + i}" for i in range(4)]
HOLD = ("hold", {"round": 0, "seconds": 10.0})


def forming(*joined: int, round: int = 0, complete: bool = False) -> StoreView:
    return StoreView(epoch="e1", round=round, complete=complete, received_at=NOW,
                     participants=tuple(StoreNode(IP[i], 0.5, False) for i in joined))


def nudges(pods, store, **fields) -> list[tuple[str, dict]]:
    result = planner.plan(job(running_status(), **fields), observed([rdzv()] + pods, store=store), NOW)
    return [(a.request.KIND, a.request.to_wire()) for a in result.actions if isinstance(a, planner.StoreAction)]


def events(pods, store, **fields) -> list[str]:
    """The Events the store's nudges carry: posted once the store did it (controller/apply.py)."""
    result = planner.plan(job(running_status(), **fields), observed([rdzv()] + pods, store=store), NOW)
    return [a.event.message for a in result.actions
            if isinstance(a, planner.StoreAction) and a.event and a.event.reason == "FirstRoundHeld"]


@pytest.mark.parametrize("case, pods, store, expected", [
    ("a worker's agent not in yet (its container runs)", [worker(0), worker(1), worker(2)], forming(0, 1), [HOLD]),
    ("a worker on its node, initializing", [worker(0), worker(1), worker(2, phase="Pending")], forming(0, 1),
     [HOLD]),
    ("every worker in: the last call ends at once", [worker(0), worker(1), worker(2)], forming(0, 1, 2),
     [("complete", {"liveNodes": 3})]),
    ("a worker not on a node yet may never be", [worker(0), worker(1), worker(2, phase="Pending", node=None)],
     forming(0, 1), [("complete", {"liveNodes": 2})]),
    ("a worker whose node check failed will not join",
     [worker(0), worker(1), worker(2, node_check_failed="gpu check failed")], forming(0, 1), []),
    ("a worker being deleted", [worker(0), worker(1), worker(2, deleting=True)], forming(0, 1),
     [("complete", {"liveNodes": 2})]),
    ("no agent in yet: no last call to hold", [worker(0), worker(1), worker(2)], forming(), []),
    ("round 0 formed already", [worker(0), worker(1), worker(2)], forming(0, 1, complete=True), []),
    ("a later round: survivors go on, the replacement joins later", [worker(0), worker(1), worker(2)],
     forming(0, 1, round=3), []),
])
def test_round_0_is_held_only_for_workers_on_their_way(case, pods, store, expected):
    assert nudges(pods, store, replicas=3) == expected, case


def test_the_hold_is_not_asked_at_max_nodes_where_torch_completes_the_round_itself():
    assert nudges([worker(0), worker(1), worker(2)], forming(0, 1), replicas=3, maxReplicas=2) == []


def test_the_hold_says_whom_it_waits_for():
    (message,) = events([worker(0), worker(1), worker(2)], forming(0, 1), replicas=3)
    assert "round 0 waits up to 10 s for 1 worker(s) still starting (train-worker-2)" in message


def test_a_worker_left_out_of_the_rendezvous_is_not_waited_for():
    status = running_status()
    status["rendezvous"] = {**status.get("rendezvous", {}), "leftOut": ["uid-w2"]}
    result = planner.plan(job(status, replicas=3), observed([rdzv(), worker(0), worker(1), worker(2)],
                                                           store=forming(0, 1)), NOW)
    assert [a.request.KIND for a in result.actions if isinstance(a, planner.StoreAction)] != ["hold"]


def test_a_store_still_checking_its_torch_is_asked_the_hold_alone():
    """The first round forms while a new store checks its torch (a few seconds): the hold is the one nudge such a
    store takes (elasticjob_store/control.py); a store whose nudges are off for good gets none."""
    checking = dataclasses.replace(forming(0, 1), nudges_off="checking", nudges_checked=False)
    assert nudges([worker(0), worker(1), worker(2)], checking, replicas=3) == [HOLD]
    assert nudges([worker(0), worker(1), worker(2)], dataclasses.replace(checking, participants=forming(
        0, 1, 2).participants), replicas=3) == []  # every agent in: no complete before the verdict
    off = dataclasses.replace(forming(0, 1), nudges_off="torch 2.99 is outside the range")
    assert nudges([worker(0), worker(1), worker(2)], off, replicas=3) == []
