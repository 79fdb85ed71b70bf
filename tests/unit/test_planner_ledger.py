"""The downtime ledger through the planner: a fault booked opens an incident, what the operator sees and the
training reports advances and closes it, and status.goodput keeps the totals and the last incidents."""

from __future__ import annotations

from datetime import timedelta

import factory
from factory import NOW, failed, observed, rdzv, running_status, store, worker

from elasticjob import planner
from elasticjob.models import ElasticJobStatus, GoodputStatus
from elasticjob.observe import NodeCheckView, ProgressView
from elasticjob.planner import ledger

SINCE = NOW - timedelta(seconds=600)


def seconds(value: float):
    return NOW + timedelta(seconds=value)


def report(**fields) -> ProgressView:
    base = dict(pod="train-worker-1", started_at=SINCE, step=300, step_at=seconds(-1.5), step_seconds=0.1,
                first_step=1, first_step_at=SINCE + timedelta(seconds=5), saved_step=290, saved_at=seconds(-2.5))
    return ProgressView(**{**base, **fields})


def step(status: ElasticJobStatus, pods, at: float, **store_fields):
    job = factory.job(status.model_dump(by_alias=True, mode="json"))
    return planner.plan(job, observed([*pods, rdzv()], store=store(**store_fields)), seconds(at))


def running() -> ElasticJobStatus:
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=2))
    status.goodput = GoodputStatus(since=SINCE.strftime("%Y-%m-%dT%H:%M:%S.000Z"), progress_reported=True)
    return status


def test_a_killed_rank0_pod_is_one_incident_with_every_phase():
    # The fault: rank 0's pod (the one that reports) ended at NOW, seen half a second later.
    plan = step(running(), [worker(0), failed(1, exit_code=137, ago=0.0)], 0.5, progress=report())
    incident = plan.status.goodput.open_incident
    assert (incident.kind, incident.pod, incident.last_step) == ("Rank0Lost", "train-worker-1", 315)
    # Its replacement runs at 2.5 s, the store reports the group re-formed at 3 s.
    plan = step(plan.status, [worker(0), worker(1)], 2.5, round=1, progress=report())
    assert plan.status.goodput.open_incident.replaced_time is not None
    # Worker 0's agent checked its node when the job started; worker 1's new one held its join 0.3 s for it.
    checks = (NodeCheckView("10.244.0.10", 0.5, SINCE), NodeCheckView("10.244.0.11", 0.3, seconds(2.8)))
    plan = step(plan.status, [worker(0), worker(1)], 3.0, round=2, progress=report(), node_checks=checks)
    assert plan.status.goodput.open_incident.round_time is not None
    assert plan.status.goodput.open_incident.node_check_held == 0.3
    # The new worker process loads step 290 from 4 s to 5.5 s and steps at 5.7 s.
    fresh = report(started_at=seconds(3.2), step=291, step_at=seconds(5.7), first_step=291,
                   first_step_at=seconds(5.7), loading_at=seconds(4.0), loaded_step=290, loaded_at=seconds(5.5),
                   saved_step=None, saved_at=None)
    plan = step(plan.status, [worker(0), worker(1)], 6.5, round=2, progress=fresh)
    ledger = plan.status.goodput
    assert ledger.open_incident is None and ledger.incidents == 1
    closed = ledger.last_incidents[-1]
    assert closed.phases.model_dump() == {"detect": 0.5, "replace": 2.0, "node_check": 0.3, "rendezvous": 0.2,
                                          "worker_start": 1.0, "checkpoint_load": 1.5, "recompute": 2.5}
    assert closed.lost_seconds == 8.0
    assert ledger.wall_seconds == 606.5 and ledger.goodput_percent == round(100 * (606.5 - 8.0) / 606.5, 2)
    assert ("Normal", "IncidentClosed", "Rank0Lost (Killed, pod train-worker-1): 8.0 s of training lost (detect 0.5, "
            "replace 2.0, nodeCheck 0.3, rendezvous 0.2, workerStart 1.0, checkpointLoad 1.5, recompute 2.5; most in recompute)") \
        in [(e.type, e.reason, e.message) for e in plan.events]


def test_without_progress_reports_the_incident_closes_at_the_round_and_the_rest_is_unknown():
    status = running()
    status.goodput.progress_reported = False
    plan = step(status, [worker(0), failed(1, ago=1.0)], 0.0)
    assert plan.status.goodput.open_incident.kind == "WorkerLost"
    plan = step(plan.status, [worker(0), worker(1)], 2.0, round=1)
    plan = step(plan.status, [worker(0), worker(1)], 3.0, round=2)
    closed = plan.status.goodput.last_incidents[-1]
    assert closed.phases.wire() == {"detect": 1.0, "replace": 2.0, "rendezvous": 1.0}  # the rest null, not 0
    assert closed.lost_seconds == 4.0
    assert plan.events[-1].message == ("WorkerLost (Error, pod train-worker-1): 4.0 s of training lost (detect 1.0, "
                                       "replace 2.0, rendezvous 1.0; most in replace; unknown: nodeCheck, "
                                       "workerStart, checkpointLoad, recompute)")


def test_a_training_that_kept_stepping_through_the_fault_lost_nothing():
    plan = step(running(), [worker(0), worker(1)], 0.0, progress=report())
    plan.status.rendezvous.last_lost_time = "2026-01-01T12:00:00Z"  # as rendezvous.py books a lost store
    job = factory.job(running().model_dump(by_alias=True, mode="json"))

    ledger.track(plan, job, observed([worker(0), worker(1)], store=store(progress=report())), seconds(0.5))
    assert plan.status.goodput.open_incident.kind == "StoreLost"
    later = report(step=340, step_at=seconds(4.0))
    plan = step(plan.status, [worker(0), worker(1)], 4.5, progress=later)
    closed = plan.status.goodput.last_incidents[-1]
    assert closed.kind == "StoreLost" and closed.lost_seconds == 0.0
    assert plan.events[-1].message.endswith(": 0.0 s of training lost (the training stepped on through it)")


def test_only_the_last_five_incidents_are_kept():
    status = running()
    status.goodput.progress_reported = False
    for n in range(7):
        plan = step(status, [worker(0), failed(1, ago=0.0, uid=f"uid-f{n}")], 0.0)
        plan = step(plan.status, [worker(0), worker(1)], 1.0, round=1)
        plan = step(plan.status, [worker(0), worker(1)], 2.0, round=2)
        status = plan.status
    assert status.goodput.incidents == 7 and len(status.goodput.last_incidents) == 5


def test_a_job_not_yet_running_has_no_ledger():
    job = factory.job()
    plan = planner.plan(job, observed([rdzv()]), NOW)
    assert plan.status.goodput is None


def test_a_worker_evicted_after_every_rank_saved_a_stop_it_asked_recomputes_none():
    # The evicted pod's agent had the training stop and save step 300 (elasticjob_warm/evicted.py), then the pod
    # went: no planned stop of the operator's, but rank 0's report says every rank saved 300.
    saved = report(step=300, saved_step=300, saved_at=seconds(-1.0), stopped_step=300, stopped_at=seconds(-0.9))
    plan = step(running(), [worker(0), failed(1, exit_code=143, ago=0.0)], 0.5, progress=saved)
    incident = plan.status.goodput.open_incident
    assert (incident.stopped_step, incident.last_step) == (300, 300)
    plan = step(plan.status, [worker(0), worker(1)], 3.0, round=2, progress=saved)
    fresh = report(started_at=seconds(3.2), step=301, step_at=seconds(5.7), first_step=301,
                   first_step_at=seconds(5.7), loading_at=seconds(4.0), loaded_step=300, loaded_at=seconds(5.5),
                   saved_step=None, saved_at=None)
    plan = step(plan.status, [worker(0), worker(1)], 6.5, round=2, progress=fresh)
    closed = plan.status.goodput.last_incidents[-1]
    assert closed.stopped_step == 300 and closed.phases.recompute == 0.0, closed


def test_rank0_lost_is_told_even_when_the_survivors_new_rank0_reported_before_the_loss_was_booked():
    """The kubelet saw rank 0's container end late (kind: a second or two): by then the survivor's new worker
    process, started after the fault, reports as rank 0 from another pod; the store's previous reporter names
    the lost pod. A report whose process started before the fault moved rank 0 earlier: a worker lost."""
    survivor = dict(pod="train-worker-0", previous_pod="train-worker-1")
    for started, kind in ((seconds(0.4), "Rank0Lost"), (seconds(-30), "WorkerLost")):
        plan = step(running(), [worker(0), failed(1, exit_code=137, ago=0.0)], 1.5,
                    progress=report(**survivor, started_at=started, step=None, step_at=None, first_step=None,
                                    first_step_at=None))
        assert booked(plan).kind == kind, started
    other = report(pod="train-worker-0", previous_pod="train-worker-2", started_at=seconds(0.4), step=None,
                   step_at=None, first_step=None, first_step_at=None)
    plan = step(running(), [worker(0), failed(1, exit_code=137, ago=0.0)], 1.5, progress=other)
    assert booked(plan).kind == "WorkerLost"


def booked(plan):
    ledger = plan.status.goodput
    return ledger.open_incident or ledger.last_incidents[-1]
