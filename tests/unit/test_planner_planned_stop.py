"""Planned stops (planner/planned_stop.py): when the operator asks the training to stop and save, what it waits
for, when the grace runs out, what it does once every rank saved; and the ledger's incident for it."""

from __future__ import annotations

from datetime import timedelta

import factory
import pytest
import test_planner_queueing as queueing
from factory import NOW, deletes, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.kueue.status import admission as kueue_admission
from elasticjob.models import ElasticJobStatus, GoodputStatus, PlannedStop
from elasticjob.observe import ProgressView
from elasticjob.planner import planned_stop
from elasticjob.planner.planned_stop import Next, next_step, precise
from elasticjob_store.protocol import Restart, Stop

ASKED = NOW - timedelta(seconds=5)
STOP_ID = f"{ASKED.timestamp():.3f}"
DEADLINE = ASKED + timedelta(seconds=30)
SINCE = NOW - timedelta(seconds=600)


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def pending(**fields) -> PlannedStop:
    base = dict(reason="ScaleDown", requested_time=precise(ASKED), deadline=precise(DEADLINE), round=4)
    return PlannedStop(**{**base, **fields})


@pytest.mark.parametrize(("stop", "listens", "grace", "now", "expected"), [
    (None, True, 30, NOW, Next.ASK),  # a training that listens: ask it
    (None, False, 30, NOW, Next.AS_TODAY),  # one that never asked should_stop: the pods go as today
    (None, True, 0, NOW, Next.AS_TODAY),  # stopGraceSeconds 0: never ask
    (pending(), True, 30, NOW, Next.WAIT),  # asked, not stopped, within the grace
    (pending(), False, 30, NOW, Next.WAIT),  # the report went quiet: the grace still bounds it
    (pending(), True, 30, DEADLINE, Next.EXPIRED),  # the grace is up: the pods go as without it
    (pending(step=120, stopped_time=precise(NOW)), True, 30, DEADLINE, Next.GO),  # stopped: go, even late
    (pending(expired=True), True, 30, NOW, Next.EXPIRED),
], ids=["ask", "not-listening", "grace-0", "wait", "wait-quiet", "expired", "stopped", "expired-before"])
def test_what_to_do_about_pods_the_operator_wants_gone(stop, listens, grace, now, expected):
    assert next_step(stop, listens, grace, now) == expected


def progress(**fields) -> ProgressView:
    base = dict(pod="train-worker-0", started_at=SINCE, step=100, step_at=NOW - timedelta(seconds=0.5),
                step_seconds=0.1, first_step=1, first_step_at=SINCE, listens=True)
    return ProgressView(**{**base, **fields})


def plan(status: dict | ElasticJobStatus, now=NOW, pods=None, replicas=2, grace=30, **store_fields):
    if isinstance(status, ElasticJobStatus):
        status = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    store_fields.setdefault("progress", progress())
    store_fields.setdefault("round", 4)
    the_job = job(status, replicas=replicas, runPolicy={"stopGraceSeconds": grace})
    pods = [worker(0), worker(1), worker(2)] if pods is None else pods
    return planner.plan(the_job, observed([rdzv(), *pods], store=factory.store(nodes=3, **store_fields)), now)


def stores(result, kind):
    return [a.request for a in result.actions if isinstance(a, planner.StoreAction) and isinstance(a.request, kind)]


def test_a_scale_down_asks_first_and_keeps_the_pod():
    result = plan(running_status(desiredReplicas=3))
    assert deletes(result) == []
    assert stores(result, Stop) == [Stop(NOW.timestamp(), planned_stop.MARGIN_SECONDS)]
    stop = result.status.planned_stop
    assert (stop.reason, stop.round, stop.deadline) == ("ScaleDown", 4, precise(NOW + timedelta(seconds=30)))
    assert "StopRequested" in [e.reason for e in result.events] and result.requeue_after <= 1


def test_without_a_listening_training_the_scale_down_is_as_today():
    result = plan(running_status(desiredReplicas=3), progress=progress(listens=False))
    assert deletes(result) == [("train-worker-2", None)] and result.status.planned_stop is None
    assert stores(result, Stop) == []


def test_while_recovering_from_an_incident_the_scale_down_is_as_today():
    """Its report may be a gone process's: no step to agree on."""
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=3))
    status.goodput = GoodputStatus(since=precise(SINCE), open_incident={"kind": "WorkerLost",
                                                                         "startTime": precise(ASKED)})
    result = plan(status)
    assert deletes(result) == [("train-worker-2", None)] and result.status.planned_stop is None


def test_the_survivors_wait_for_the_leaving_pods_containers_to_stop():
    done = pending(step=123, stopped_time=precise(NOW))
    status = running_status(desiredReplicas=2, plannedStop=done.wire())
    result = plan(status, pods=[worker(0), worker(1), worker(2, deleting=True)], stop_id=STOP_ID, stop_step=123)
    assert stores(result, Restart) == [] and result.status.planned_stop is not None


def test_once_the_store_picked_the_step_it_is_not_asked_again_and_the_pod_waits():
    status = running_status(desiredReplicas=2, plannedStop=pending().wire())
    result = plan(status, stop_id=STOP_ID, stop_step=123)
    assert deletes(result) == [] and stores(result, Stop) == []
    assert result.status.planned_stop.step == 123


def test_every_rank_saved_the_pod_goes_and_a_worker_that_exits_0_did_not_finish_the_training():
    status = running_status(desiredReplicas=2, plannedStop=pending(step=123).wire())
    result = plan(status, stop_id=STOP_ID, stop_step=123, progress=progress(step=123, stopped_step=123))
    assert deletes(result) == [("train-worker-2", None)]
    assert result.status.planned_stop.stopped_time == precise(NOW)
    assert "StoppedAndSaved" in [e.reason for e in result.events]
    # The pod that went exited 0; the others hold, then are restarted: the job did not succeed.
    gone = worker(2, "Succeeded", exit_code=0, finished_at=at(1))
    result = plan(result.status, at(2), pods=[worker(0), worker(1), gone], stop_id=STOP_ID, stop_step=123,
                  progress=progress(step=123, stopped_step=123))
    assert (result.status.phase, result.status.reason) == ("Running", "Running")
    assert result.status.planned_stop is not None


def test_the_survivors_restart_once_the_leaving_pod_is_gone_and_the_stop_is_forgotten_after():
    done = pending(step=123, stopped_time=precise(NOW))
    status = running_status(desiredReplicas=2, plannedStop=done.wire())
    result = plan(status, pods=[worker(0), worker(1)], stop_id=STOP_ID, stop_step=123)
    assert stores(result, Restart) == [Restart(4)] and result.status.planned_stop is not None
    result = plan(result.status, at(3), pods=[worker(0), worker(1)], round=5)  # re-formed without it
    assert stores(result, Restart) == [] and result.status.planned_stop is None


def test_past_the_grace_the_pod_goes_as_today_and_no_restart_is_asked():
    status = running_status(desiredReplicas=2, plannedStop=pending(step=123).wire())
    result = plan(status, DEADLINE, stop_id=STOP_ID, stop_step=123)
    assert deletes(result) == [("train-worker-2", None)] and result.status.planned_stop.expired
    assert "StopGraceExpired" in [e.reason for e in result.events]
    result = plan(result.status, DEADLINE + timedelta(seconds=2), pods=[worker(0), worker(1)])
    assert stores(result, Restart) == [] and result.status.planned_stop is None


def test_a_suspension_waits_for_the_stop_then_stops_every_pod():
    the_job = job(running_status(), runPolicy={"suspend": True, "stopGraceSeconds": 30})
    seen = observed([rdzv(), worker(0), worker(1)], store=factory.store(round=4, progress=progress()))
    result = planner.plan(the_job, seen, NOW)
    assert deletes(result) == [] and (result.status.phase, result.status.reason) == ("Running", "Stopping")
    assert [r.margin_seconds for r in stores(result, Stop)] == [planned_stop.MARGIN_SECONDS]
    status = result.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    stop_id = f"{NOW.timestamp():.3f}"
    the_job = job(status, runPolicy={"suspend": True, "stopGraceSeconds": 30})
    seen = observed([rdzv(), worker(0), worker(1)], store=factory.store(
        round=4, stop_id=stop_id, stop_step=110, progress=progress(step=110, stopped_step=110)))
    result = planner.plan(the_job, seen, at(2))
    assert deletes(result) == [("train-worker-0", None), ("train-worker-1", None)]  # the store once they are gone
    assert result.status.phase == "Suspended"
    incident = result.status.goodput.open_incident if result.status.goodput else None
    assert incident is None or incident.stopped_step == 110


def ledger_status(**extra) -> ElasticJobStatus:
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=3, **extra))
    status.goodput = GoodputStatus(since=precise(SINCE), progress_reported=True)
    return status


def test_the_ledger_shows_no_step_recomputed_for_a_planned_scale_down():
    # The scale-down opens the incident; the training stops after step 123, which every rank saved.
    result = plan(ledger_status())
    assert result.status.goodput.open_incident.kind == "ScaleChange"
    # The training steps on towards the agreed step: it is not a training that stepped through the scale-down
    # (seen in CI: the incident closed at 0 s here, and the stop it then saved was booked nowhere).
    result = plan(result.status, at(1), stop_id=f"{NOW.timestamp():.3f}", stop_step=123,
                  progress=progress(step=110, step_at=at(0.9)))
    assert result.status.goodput.open_incident is not None and result.status.goodput.incidents == 0
    result = plan(result.status, at(3), stop_id=f"{NOW.timestamp():.3f}", stop_step=123,
                  progress=progress(step=123, step_at=at(2.5), stopped_step=123, stopped_at=at(2.8)))
    incident = result.status.goodput.open_incident
    assert (incident.stopped_step, incident.last_step, incident.start_time) == (123, 123, precise(at(3)))
    # The survivors restart, load step 123 and step on from 124.
    fresh = progress(started_at=at(5), step=124, step_at=at(7), first_step=124, first_step_at=at(7),
                     loading_at=at(6), loaded_step=123, loaded_at=at(6.5), step_seconds=0.1)
    result = plan(result.status, at(8), pods=[worker(0), worker(1)], round=5, progress=fresh)
    closed = result.status.goodput.last_incidents[-1]
    assert closed.kind == "ScaleChange" and closed.phases.recompute == 0.0
    assert result.status.restarts == 0 and result.status.last_failures == []  # nothing charged


def test_a_scale_down_the_operator_did_not_stop_first_is_booked_from_the_stop_its_leaving_agent_asked():
    """The training did not listen yet (or an incident was open): the leaving pod is deleted at once, its agent asks
    the stop on SIGTERM, and the training steps on until every rank saved. Those steps do not close the scale-down
    at 0 s (seen in CI: the saved step was then booked nowhere)."""
    result = plan(ledger_status(), progress=progress(listens=False))
    assert deletes(result) == [("train-worker-2", None)] and result.status.planned_stop is None
    going = worker(2, deleting=True)
    result = plan(result.status, at(1), pods=[worker(0), worker(1), going],
                  progress=progress(step=110, step_at=at(0.9), listens=False))
    ledger = result.status.goodput
    assert ledger.incidents == 0 and ledger.open_incident.kind == "ScaleChange"
    assert (ledger.open_incident.start_time, ledger.open_incident.last_step) == (precise(at(0.9)), 110)
    # The same step seen again (a doubled answer, or the operator restarted from this status) moves nothing.
    again = plan(result.status, at(1.5), pods=[worker(0), worker(1), going],
                 progress=progress(step=110, step_at=at(0.9), listens=False)).status.goodput
    assert (again.incidents, again.open_incident.start_time, again.open_incident.last_step) == \
        (0, precise(at(0.9)), 110)
    saved = dict(stop_id=f"{at(1).timestamp():.3f}", stop_step=123,
                 progress=progress(step=123, step_at=at(2.5), stopped_step=123, stopped_at=at(2.8), listens=False))
    result = plan(result.status, at(3), pods=[worker(0), worker(1), going], **saved)
    assert result.status.planned_stop.reason == "AgentAsked"
    assert result.status.goodput.open_incident.stopped_step == 123
    fresh = progress(started_at=at(5), step=124, step_at=at(7), first_step=124, first_step_at=at(7),
                     loading_at=at(6), loaded_step=123, loaded_at=at(6.5), step_seconds=0.1)
    result = plan(result.status, at(8), pods=[worker(0), worker(1)], round=5, progress=fresh)
    closed = result.status.goodput.last_incidents[-1]
    assert (closed.kind, closed.stopped_step, closed.phases.recompute) == ("ScaleChange", 123, 0.0)


def test_kueues_preemption_waits_for_the_stop_then_stops_every_pod_and_queues():
    pods = [rdzv(), worker(0), worker(1)]
    seen = factory.store(round=4, progress=progress())
    result = queueing.plan(queueing.kueue_job(running_status(), suspend=True), pods, store=seen,
                           workload=queueing.workload(queueing.PREEMPTED, queueing.admission(2)))
    assert deletes(result) == [] and (result.status.phase, result.status.reason) == ("Running", "Stopping")
    assert result.status.planned_stop.reason == "Preempted" and len(stores(result, Stop)) == 1
    status = result.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    seen = factory.store(round=4, stop_id=f"{NOW.timestamp():.3f}", stop_step=110,
                         progress=progress(step=110, stopped_step=110))
    result = queueing.plan(queueing.kueue_job(status, suspend=True), pods, store=seen,
                           workload=queueing.workload(queueing.PREEMPTED, queueing.admission(2)))
    assert deletes(result) == [("train-worker-0", None), ("train-worker-1", None)]  # the store once they are gone
    assert (result.status.phase, kueue_admission(result.status).state) == ("Queued", "Preempted")


def test_a_stop_a_workers_agent_asked_is_taken_up_and_the_survivors_restart_once_the_pod_is_gone():
    """The operator removed a worker before the training said it listens; the leaving agent asked the store on
    SIGTERM, every rank saved and holds. No pod joins after a scale-down: without the operator's Restart the
    survivors held until their own timeout (a CI failure)."""
    saved = dict(stop_id=STOP_ID, stop_step=13, progress=progress(step=13, stopped_step=13))
    going = worker(2, deleting=True)
    result = plan(running_status(desiredReplicas=2), pods=[worker(0), worker(1), going], **saved)
    stop = result.status.planned_stop
    assert (stop.reason, stop.step, stop.round, stop.stopped_time) == ("AgentAsked", 13, 4, precise(NOW))
    assert planned_stop.stop_id(stop) == STOP_ID
    assert "StoppedAndSaved" in [e.reason for e in result.events] and stores(result, Restart) == []
    result = plan(result.status, at(1), pods=[worker(0), worker(1)], **saved)
    assert stores(result, Restart) == [Restart(4)]
    # Re-formed without it; rank 0's new process has not reported yet: the old report still says it saved.
    result = plan(result.status, at(3), pods=[worker(0), worker(1)], round=5, **saved)
    assert result.status.planned_stop is None and result.status.last_stop == STOP_ID
    result = plan(result.status, at(4), pods=[worker(0), worker(1)], round=5, **saved)
    assert result.status.planned_stop is None and stores(result, Restart) == []


def test_after_an_eviction_the_survivors_wait_for_the_replacement_within_the_grace():
    """Its agent joining restarts them at the full size, once; a replacement that cannot start costs the
    survivors the grace, not their 10-minute hold."""
    saved = dict(stop_id=STOP_ID, stop_step=13, progress=progress(step=13, stopped_step=13))
    result = plan(running_status(desiredReplicas=3), pods=[worker(0, deleting=True), worker(1), worker(2)],
                  replicas=3, **saved)
    assert result.status.planned_stop.reason == "AgentAsked" and stores(result, Restart) == []
    assert result.status.planned_stop.deadline == precise(at(30))
    for pods in ([worker(1), worker(2)], [worker(0, "Pending"), worker(1), worker(2)], [worker(0), worker(1), worker(2)]):
        waiting = plan(result.status, at(5), pods=pods, replicas=3, **saved)  # gone; replaced; running, not joined
        assert stores(waiting, Restart) == [] and waiting.requeue_after <= 1
    joined = plan(result.status, at(8), pods=[worker(0), worker(1), worker(2)], replicas=3, round=5, **saved)
    assert stores(joined, Restart) == [] and joined.status.planned_stop is None
    late = plan(result.status, at(31), pods=[worker(1), worker(2)], replicas=3, **saved)
    assert stores(late, Restart) == [Restart(4)]


@pytest.mark.parametrize("fields", [
    dict(stop_id=STOP_ID, stop_step=13, progress=progress(step=13)),  # asked, not every rank saved yet
    dict(stop_id=STOP_ID, stop_step=13, progress=progress(step=20, stopped_step=12)),  # an older stop's report
    dict(stop_id="not-a-time", stop_step=13, progress=progress(step=13, stopped_step=13)),
], ids=["not-saved-yet", "other-step", "bad-id"])
def test_no_stop_is_taken_up_before_every_rank_saved_it(fields):
    result = plan(running_status(desiredReplicas=2), pods=[worker(0), worker(1)], **fields)
    assert result.status.planned_stop is None and stores(result, Restart) == []


def test_a_settled_stop_of_the_operators_own_is_not_taken_up_again():
    done = pending(step=123, stopped_time=precise(NOW))
    saved = dict(stop_id=STOP_ID, stop_step=123, progress=progress(step=123, stopped_step=123))
    result = plan(running_status(desiredReplicas=2, plannedStop=done.wire()), pods=[worker(0), worker(1)], **saved)
    assert stores(result, Restart) == [Restart(4)]
    for later in (3, 4):
        result = plan(result.status, at(later), pods=[worker(0), worker(1)], round=5, **saved)
        assert result.status.planned_stop is None and stores(result, Restart) == []


def test_a_suspension_the_training_steps_on_into_is_booked_from_its_last_step_not_closed_at_0():
    # No planned stop (stopGraceSeconds 0, as for torchrun run as written): the pods are deleted at once, and the
    # training steps on until they end. Those steps are not a training that stepped through the suspension.
    status = ledger_status()
    the_job = job(status.model_dump(by_alias=True, mode="json", exclude_none=True),
                  replicas=3, runPolicy={"suspend": True, "stopGraceSeconds": 0})
    seen = observed([rdzv(), worker(0), worker(1), worker(2)], store=factory.store(round=4, progress=progress(step=100)))
    result = planner.plan(the_job, seen, NOW)
    assert result.status.phase == "Suspended" and result.status.goodput.open_incident.kind == "Suspend"
    the_job = job(result.status.model_dump(by_alias=True, mode="json", exclude_none=True),
                  replicas=3, runPolicy={"suspend": True, "stopGraceSeconds": 0})
    seen = observed([rdzv(), worker(0), worker(1), worker(2)], store=factory.store(round=4, progress=progress(
        step=112, step_at=at(1.2))))
    result = planner.plan(the_job, seen, at(1.5))
    ledger = result.status.goodput
    assert ledger.incidents == 0 and ledger.open_incident is not None, ledger
    assert (ledger.open_incident.start_time, ledger.open_incident.last_step) == (precise(at(1.2)), 112)
    # The same report seen again (a doubled answer, or a reconcile after the operator restarted from this status)
    # moves nothing.
    again = job(result.status.model_dump(by_alias=True, mode="json", exclude_none=True),
                replicas=3, runPolicy={"suspend": True, "stopGraceSeconds": 0})
    ledger = planner.plan(again, seen, at(2.0)).status.goodput
    assert (ledger.incidents, ledger.open_incident.start_time, ledger.open_incident.last_step) == \
        (0, precise(at(1.2)), 112)
