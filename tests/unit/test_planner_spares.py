"""Warm spares in the plan (planner/spares.py and where it is used): the pods a job with spares runs, the seats the
store is told, which pods count as spares, the rounds ended early with them, and the job's end."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import NOW, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.observe import SeatsView, StoreNode, StoreView
from elasticjob.planner.base import CreateObject, DeletePod

IP = [f"10.244.0.{10 + i}" for i in range(5)]


def store(*joined: int, round: int = 1, complete: bool = False, count: int = 3, spares: tuple[int, ...] = (),
          joining: tuple[int, ...] = (), last: tuple[int, ...] = ()) -> StoreView:
    held = tuple(IP[i] for i in (*joined, *joining))
    return StoreView(epoch="e1", round=round, complete=complete, received_at=NOW,
                     participants=tuple(StoreNode(IP[i], 0.5, False) for i in joined),
                     last_round_nodes=tuple(IP[i] for i in last),
                     seats=SeatsView(count, held, tuple(IP[i] for i in spares), tuple(IP[i] for i in joining)))


def plan(pods, view, status=None, **spec):
    return planner.plan(job(status or running_status(), **{"replicas": 3, "spares": 1, **spec}),
                        observed([rdzv(), *pods], store=view), NOW)


def nudges(result) -> list[tuple[str, dict]]:
    return [(a.request.KIND, a.request.to_wire()) for a in result.actions if isinstance(a, planner.StoreAction)]


def test_a_job_with_spares_runs_its_workers_and_its_spares():
    result = plan([], None, status=running_status(), spares=2)
    made = sorted(a.manifest["metadata"]["name"] for a in result.actions if isinstance(a, CreateObject)
                  and a.manifest["kind"] == "Pod")
    assert len(made) == 5
    assert (result.status.desired_replicas, result.status.desired_spares) == (3, 2)
    env = {e["name"]: e.get("value") for a in result.actions if isinstance(a, CreateObject)
           and a.manifest["kind"] == "Pod" for e in a.manifest["spec"]["containers"][0]["env"]}
    assert env["ELASTICJOB_SEATS"] == "1"


def test_without_spares_no_agent_asks_for_a_seat():
    result = plan([], None, spares=0)
    for action in result.actions:
        if isinstance(action, CreateObject) and action.manifest["kind"] == "Pod":
            assert "ELASTICJOB_SEATS" not in {e["name"] for e in action.manifest["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("case, view, expected", [
    ("the store holds the count already", store(0, 1, 2, complete=True), []),
    ("a store that started with another count", store(0, 1, 2, complete=True, count=2),
     [("seats", {"count": 3})]),
    ("an older store (no seats reported)", StoreView(epoch="e1", round=1, complete=True, received_at=NOW),
     [("seats", {"count": 3})]),
])
def test_the_store_is_told_the_seats(case, view, expected):
    pods = [worker(i) for i in range(4)]
    assert [n for n in nudges(plan(pods, view)) if n[0] == "seats"] == expected, case


def test_a_scale_up_raises_the_seats_and_a_spare_takes_the_new_one():
    pods = [worker(i) for i in range(4)]
    assert ("seats", {"count": 4}) in nudges(plan(pods, store(0, 1, 2, complete=True, spares=(3,)), replicas=4))


def test_spares_are_counted_apart_from_the_workers():
    pods = [worker(i) for i in range(5)]
    result = plan(pods, store(0, 1, 2, complete=True, spares=(3, 4)), spares=2)
    assert (result.status.replicas, result.status.ready_replicas, result.status.spares) == (3, 3, 2)


def test_a_spare_not_ready_is_not_counted_ready():
    pods = [worker(i) for i in range(3)] + [worker(3, ready=False)]
    assert plan(pods, store(0, 1, 2, complete=True, spares=(3,))).status.spares == 0


def test_after_a_loss_the_round_waits_for_the_spare_not_the_last_call():
    """Rank 0's pod went: the two survivors are in the new round, the spare still waits for the freed seat (the
    store grants it at its next tick). Ending the round now would form it at 2 and restart again at 3."""
    pods = [worker(1), worker(2), worker(3)]
    assert nudges(plan(pods, store(1, 2, spares=(3,), last=(0, 1, 2)))) == []


def test_the_round_completes_once_the_spare_given_the_seat_joined():
    pods = [worker(1), worker(2), worker(3)]
    assert nudges(plan(pods, store(1, 2, joining=(3,), last=(0, 1, 2)))) == []  # on its way: still waited for
    assert nudges(plan(pods, store(1, 2, 3, last=(0, 1, 2)))) == [("complete", {"liveNodes": 3})]


def test_a_spare_still_starting_holds_no_round():
    """Round 0 with every seat in: the pod still starting will be a spare; neither the hold nor a wait for it."""
    pods = [worker(0), worker(1), worker(2), worker(3, phase="Pending")]
    result = plan(pods, store(0, 1, 2, round=0))
    assert nudges(result) == [("complete", {"liveNodes": 3})]


def test_round_0_is_held_for_a_worker_starting_but_not_for_a_spare():
    pods = [worker(0), worker(1), worker(2), worker(3)]
    assert [n[0] for n in nudges(plan(pods, store(0, 1, round=0, spares=(3,))))] == ["hold"]
    assert [n[0] for n in nudges(plan(pods, store(0, 1, round=0, spares=(2, 3)), replicas=3, spares=1))] == []


def test_at_the_end_the_spares_are_removed():
    pods = [worker(0, phase="Succeeded", exit_code=0), worker(1, phase="Succeeded", exit_code=0),
            worker(2, phase="Succeeded", exit_code=0), worker(3)]
    result = plan(pods, store(0, 1, 2, complete=True, spares=(3,)))
    deleted = [a for a in result.actions if isinstance(a, DeletePod) and a.name.startswith("train-worker")]
    assert [(a.name, a.event.reason if a.event else None) for a in deleted] == [("train-worker-3", "RemovedSpare")]
    assert result.status.phase == "Running" and "waiting for train-worker-3 to exit" in result.status.message
    pods[3] = worker(3, deleting=True)
    assert plan(pods, store(0, 1, 2, complete=True, spares=(3,))).status.phase == "Succeeded"


def test_kueue_is_asked_for_the_spares_with_the_workers():
    from elasticjob.kueue import workloads

    (workers, _store) = workloads.pod_sets(job(spares=2, replicas=3, minReplicas=2).ref)
    assert (workers["count"], workers["minCount"]) == (5, 2)


def test_a_scale_down_whose_highest_pod_is_a_spare_takes_a_seated_pod_out_too():
    """replicas 3 -> 2 with one spare: pod 3 (the highest) goes, but it was the spare, and three agents would
    train on; so the highest seated pod goes as well, and its replacement comes back as the spare."""
    pods = [worker(i) for i in range(4)]
    result = plan(pods, store(0, 1, 2, complete=True, spares=(3,)), replicas=2)
    assert ("seats", {"count": 2}) in nudges(result)
    stopped = sorted(a.name for a in result.actions if isinstance(a, DeletePod))
    assert stopped == ["train-worker-2", "train-worker-3"], stopped


def test_a_scale_down_whose_highest_pod_is_seated_takes_that_one_alone():
    pods = [worker(i) for i in range(4)]
    result = plan(pods, store(0, 1, 3, complete=True, spares=(2,)), replicas=2)
    assert sorted(a.name for a in result.actions if isinstance(a, DeletePod)) == ["train-worker-3"]


def cut(index: int, ago: float, **fields) -> object:
    """A pod whose containers turned not ready `ago` seconds before NOW, after they had been ready."""
    return worker(index, ready=False, lost_ready_at=NOW - timedelta(seconds=ago), **fields)


def stopped(result) -> list[tuple[str, int | None, str | None]]:
    return [(a.name, a.grace_seconds, a.event.reason if a.event else None) for a in result.actions
            if isinstance(a, DeletePod)]


def test_a_spare_cut_off_is_stopped_at_once_and_its_node_avoided_nothing_charged():
    pods = [worker(0), worker(1), worker(2), cut(3, ago=4, node="node-b")]
    result = plan(pods, store(0, 1, 2, complete=True, spares=(3,)))
    assert stopped(result) == [("train-worker-3", 0, "Partitioned")]
    assert [(n.node, n.reason) for n in result.status.avoided_nodes] == [("node-b", "Partitioned")]
    assert (result.status.restarts, result.status.counted_failures, nudges(result)) == (0, [], [])


@pytest.mark.parametrize("case, pods, view", [
    ("not ready for less than CUT_OFF_AFTER", [worker(0), worker(1), worker(2), cut(3, ago=1)],
     store(0, 1, 2, complete=True, spares=(3,))),
    ("not ready since it started (its agent still starting)", [worker(0), worker(1), worker(2),
                                                                worker(3, ready=False)],
     store(0, 1, 2, complete=True)),
    ("a seated worker: its agent in the round is recovery's", [cut(0, ago=4), worker(1), worker(2), worker(3)],
     store(0, 1, 2, complete=True, spares=(3,))),
    ("a spare given a seat, on its way into the round", [worker(0), worker(1), cut(3, ago=4)],
     store(0, 1, joining=(3,), last=(0, 1, 2))),
    ("a job without spares", [worker(0), worker(1), worker(2), cut(3, ago=4)],
     store(0, 1, 2, complete=True)),
])
def test_no_spare_is_stopped_without_the_evidence(case, pods, view):
    spec = {"spares": 0} if case == "a job without spares" else {}
    result = plan(pods, view, **spec)
    assert [s for s in stopped(result) if s[2] == "Partitioned"] == [], case


def test_a_spare_not_ready_for_a_moment_is_looked_at_again_when_the_wait_is_over():
    result = plan([worker(0), worker(1), worker(2), cut(3, ago=1)], store(0, 1, 2, complete=True, spares=(3,)))
    assert result.requeue_after == pytest.approx(2.0)


def test_a_spare_not_ready_just_after_the_store_came_back_is_left():
    """Every agent lost the store: a spare not ready yet is no cut-off until the store has served a while."""
    back = running_status(conditions=[{"type": "RendezvousReady", "status": "True", "reason": "StoreReady",
                                       "lastTransitionTime": "2026-01-01T11:59:58Z"}])
    result = plan([worker(0), worker(1), worker(2), cut(3, ago=4)], store(0, 1, 2, complete=True, spares=(3,)),
                  status=back)
    assert stopped(result) == []


def test_a_cut_off_spare_seen_again_is_stopped_by_its_uid_alone_and_once_gone_never():
    """A late or doubled event shows the spare again: the delete names its uid (a new pod under the name is never
    hit), and once it is on its way out nothing more is done for it."""
    view = store(0, 1, 2, complete=True, spares=(3,))
    first = plan([worker(0), worker(1), worker(2), cut(3, ago=4)], view)
    again = plan([worker(0), worker(1), worker(2), cut(3, ago=4)], view, status=first.status.model_dump(
        by_alias=True, exclude_none=True))
    assert [(a.name, a.uid) for a in again.actions if isinstance(a, DeletePod)] == [("train-worker-3", "uid-w3")]
    leaving = plan([worker(0), worker(1), worker(2), cut(3, ago=5, deleting=True)], view)
    assert stopped(leaving) == []
