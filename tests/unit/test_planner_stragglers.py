"""Stragglers (planner/stragglers.py): a worker whose forward takes spec.stragglers.factor times the others' for
windowSeconds is replaced and its node avoided; nothing is charged. Table tests through planner.plan, with the
orderings the controller can see: the same answer twice, the status write lost between two plans, the pod gone
before the next look, a lying pace."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import NOW, job, observed, rdzv, running_status, store, worker

from elasticjob import planner
from elasticjob.observe import PaceView, ProgressView

SLOW_NODE = "node-slow"


def again(result, **fields):
    return job(result.status.model_dump(by_alias=True, mode="json"), **fields)


def workers(n: int = 3, slow: int = 0) -> list:
    return [rdzv(), *(worker(i, node=SLOW_NODE if i == slow else f"node-{i}") for i in range(n))]


def paces(*seconds: float, names: tuple[str, ...] | None = None) -> tuple[PaceView, ...]:
    names = names or tuple(f"train-worker-{i}" for i in range(len(seconds)))
    return tuple(PaceView(pod=name, seconds=s) for name, s in zip(names, seconds, strict=True))


def seen(pace: tuple[PaceView, ...], n: int = 3, **fields):
    return observed(workers(n), store=store(nodes=n, pace=pace, **fields))


def spec3(**stragglers):
    return {"replicas": 3, "maxReplicas": 3, **({"stragglers": stragglers} if stragglers else {})}


def deletes(result: planner.Plan) -> list[planner.DeletePod]:
    return [a for a in result.actions if isinstance(a, planner.DeletePod)]


def reasons(result: planner.Plan) -> list[str]:
    return [e.reason for e in result.events]


def watch(pace, seconds_after: list[float], **spec):
    """Plans at each of `seconds_after` NOW with the same paces, each from the status the last one wrote."""
    result = planner.plan(job(running_status(), **spec3(**spec)), seen(pace), NOW)
    for later in seconds_after:
        result = planner.plan(again(result, **spec3(**spec)), seen(pace), NOW + timedelta(seconds=later))
    return result


def test_a_pod_three_times_slower_is_noted_then_replaced_after_the_window_and_its_node_avoided():
    first = watch(paces(0.06, 0.02, 0.021), [])
    assert "SlowWorker" in reasons(first) and deletes(first) == []
    noted = first.status.straggler
    assert (noted.pod, noted.node, noted.factor) == ("train-worker-0", SLOW_NODE, pytest.approx(2.93, abs=0.01))
    assert first.requeue_after is not None and first.requeue_after <= 15
    middle = watch(paces(0.06, 0.02, 0.021), [10])
    assert deletes(middle) == [] and middle.status.straggler.since == noted.since
    done = watch(paces(0.06, 0.02, 0.021), [10, 15])
    stop, = deletes(done)
    assert (stop.name, stop.grace_seconds, stop.event.reason) == ("train-worker-0", None, "StragglerReplaced")
    avoided, = done.status.avoided_nodes
    assert (avoided.node, avoided.reason) == (SLOW_NODE, "SlowNode")
    assert done.status.restarts == 0 and done.status.straggler.replaced


def test_after_the_replacement_the_old_pod_is_not_noted_again_and_its_successor_is_judged_afresh():
    pace = paces(0.06, 0.02, 0.021)
    done = watch(pace, [10, 15])
    cache_late = planner.plan(again(done, **spec3()), seen(pace), NOW + timedelta(seconds=16))
    assert deletes(cache_late) == [] and "SlowWorker" not in reasons(cache_late), "the deletion not seen yet"
    successor = [rdzv(), worker(0, node="node-9", uid="uid-w0-new"), worker(1, node="node-1"),
                 worker(2, node="node-2")]
    gone = planner.plan(again(cache_late, **spec3()), observed(successor, store=store(nodes=3, pace=pace)),
                        NOW + timedelta(seconds=30))
    assert gone.status.straggler.uid == "uid-w0-new" and "SlowWorker" in reasons(gone), "a new pod, a new window"
    assert deletes(gone) == []


def test_the_same_answer_twice_does_not_restart_the_window_nor_repeat_the_event():
    twice = watch(paces(0.06, 0.02, 0.021), [0, 0])
    assert reasons(twice).count("SlowWorker") == 0, "the second plan saw the straggler the first noted"
    assert twice.status.straggler.since == watch(paces(0.06, 0.02, 0.021), []).status.straggler.since


def test_a_lost_status_write_only_delays_the_replacement():
    """The operator killed between the plan and its status write: the next plan starts the window again."""
    pace = paces(0.06, 0.02, 0.021)
    lost = planner.plan(job(running_status(), **spec3()), seen(pace), NOW + timedelta(seconds=20))
    assert deletes(lost) == [] and lost.status.straggler is not None


@pytest.mark.parametrize("pace, why", [
    (paces(0.03, 0.02, 0.021), "1.5 times is below the factor of 2"),
    (paces(0.0058, 0.0019, 0.002), "3 times, but 4 ms more per forward: a small model's noise (seen on real nodes)"),
    (paces(0.06, 0.02), "the third worker reports nothing: it is still two, and 3 times"),
    (paces(0.06), "one pace: nothing to compare with"),
    (paces(0.06, 0.02, 0.021, names=("somebody-else", "train-worker-1", "train-worker-2")),
     "a pod that is not one of the job's workers"),
])
def test_no_straggler_where_there_is_none_to_compare_or_too_little_difference(pace, why):
    result = watch(pace, [30])
    expect_one = why.startswith("the third")
    assert (len(deletes(result)) == 1) == expect_one, why


def test_a_pod_that_catches_up_is_forgotten_and_a_new_window_starts_if_it_slows_again():
    slow, calm = paces(0.06, 0.02, 0.021), paces(0.022, 0.02, 0.021)
    first = planner.plan(job(running_status(), **spec3()), seen(slow), NOW)
    caught_up = planner.plan(again(first, **spec3()), seen(calm), NOW + timedelta(seconds=10))
    assert caught_up.status.straggler is None and "SlowWorkerRecovered" in reasons(caught_up)
    slow_again = planner.plan(again(caught_up, **spec3()), seen(slow), NOW + timedelta(seconds=20))
    assert deletes(slow_again) == [] and "SlowWorker" in reasons(slow_again)


@pytest.mark.parametrize("fields, why", [
    ({"complete": False}, "the round is forming"),
    ({"closed": True}, "the training is finishing"),
    ({"progress": ProgressView(step=5, stalled=True)}, "every rank waits: a peer is cut off, not slow"),
])
def test_nothing_is_replaced_while_the_job_is_not_calm_and_the_window_holds_until_it_is(fields, why):
    pace = paces(0.06, 0.02, 0.021)
    first = planner.plan(job(running_status(), **spec3()), seen(pace), NOW)
    later = planner.plan(again(first, **spec3()), seen(pace, **fields), NOW + timedelta(seconds=30))
    assert deletes(later) == [], why
    assert later.status.straggler == first.status.straggler, "held, not forgotten: the slow rank may stall it"
    calm_again = planner.plan(again(later, **spec3()), seen(pace), NOW + timedelta(seconds=31))
    assert [d.name for d in deletes(calm_again)] == ["train-worker-0"]


def test_turned_off_or_a_higher_factor_replaces_nothing():
    assert deletes(watch(paces(0.06, 0.02, 0.021), [30], enabled=False)) == []
    assert deletes(watch(paces(0.06, 0.02, 0.021), [30], factor=4)) == []
    assert len(deletes(watch(paces(0.06, 0.02, 0.021), [5], windowSeconds=5))) == 1


def test_a_pod_already_going_is_not_compared_and_its_straggler_is_forgotten_silently():
    pace = paces(0.06, 0.02, 0.021)
    first = planner.plan(job(running_status(), **spec3()), seen(pace), NOW)
    going = [rdzv(), worker(0, node=SLOW_NODE, deleting=True), worker(1, node="node-1"), worker(2, node="node-2")]
    later = planner.plan(again(first, **spec3()), observed(going, store=store(nodes=3, pace=pace)),
                         NOW + timedelta(seconds=30))
    assert deletes(later) == [] and later.status.straggler is None
    assert "SlowWorkerRecovered" not in reasons(later)


def test_the_slowest_of_two_is_compared_with_the_other():
    result = planner.plan(job(running_status()), observed([rdzv(), worker(0), worker(1)],
                                                          store=store(pace=paces(0.02, 0.05))), NOW)
    assert result.status.straggler.pod == "train-worker-1"


def test_a_pod_slower_than_the_store_looks_for_but_under_the_factor_is_looked_at_again_soon():
    """The store's long-poll answers when which pod is 1.5 times slower changes, not when its factor passes 2: a
    pod slow at its start, noted, caught up to 1.6 times, then slowed again, must be seen without a new answer."""
    near = planner.plan(job(running_status(), **spec3()), seen(paces(0.032, 0.02, 0.021)), NOW)
    assert near.status.straggler is None and near.requeue_after <= 4
    far = planner.plan(job(running_status(), **spec3()), seen(paces(0.022, 0.02, 0.021)), NOW)
    assert far.requeue_after > 4, "nothing near slow: no extra look"


def test_the_planner_and_the_store_look_from_the_same_factor():
    from elasticjob.models import StragglerSpec
    from elasticjob.planner import stragglers
    from elasticjob_store import pace

    assert stragglers.LOOK_FACTOR == pace.LOOK_FACTOR == StragglerSpec.model_fields["factor"].metadata[0].ge
    assert stragglers.LOOK_AGAIN == 2 * pace.READ_EVERY


def test_while_the_job_is_not_calm_a_slow_pod_is_looked_at_again_soon():
    result = planner.plan(job(running_status(), **spec3()),
                          seen(paces(0.06, 0.02, 0.021), progress=ProgressView(step=5, stalled=True)), NOW)
    assert result.status.straggler is None and result.requeue_after <= 4
