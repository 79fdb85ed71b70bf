"""When an incident starts: the operator's evidence (a container's finishedAt, to the second; a last heartbeat),
moved later to the training's last step where that step is the lost world's and within the evidence's slack."""

from __future__ import annotations

from datetime import timedelta

import factory
import pytest
from factory import NOW, failed, observed, rdzv, running_status, store, worker

from elasticjob import planner
from elasticjob.models import ElasticJobStatus, GoodputStatus
from elasticjob.observe import ProgressView
from elasticjob.planner import goodput

SECOND = timedelta(seconds=1)


def at(value: float | None):
    return None if value is None else NOW + timedelta(seconds=value)


# (evidence 0 s; slack; detected; the report's process started; its last step) -> the start
CASES = {
    "the last step within finishedAt's second": (SECOND, 1.5, -60, 0.7, 0.7),
    "a step before finishedAt": (SECOND, 1.5, -60, -0.3, 0.0),
    "a step past the second: a world that stepped on": (SECOND, 2.5, -60, 1.2, 0.0),
    "a step after detection": (SECOND, 0.5, -60, 0.7, 0.0),
    "a process started after the fault": (SECOND, 1.5, 0.2, 0.7, 0.0),
    "a report that does not say when its process started": (SECOND, 1.5, None, 0.7, 0.0),
    "no step reported": (SECOND, 1.5, -60, None, 0.0),
    "a precise time has no slack": (timedelta(0), 1.5, -60, 0.7, 0.0),
    "a last heartbeat: any step up to detection": (None, 6.5, -60, 4.0, 4.0),
}


@pytest.mark.parametrize("slack, detected, started, step_at, expected", CASES.values(), ids=CASES.keys())
def test_fault_start(slack, detected, started, step_at, expected):
    assert goodput.fault_start(NOW, slack, at(detected), at(started), at(step_at)) == at(expected)


def running() -> ElasticJobStatus:
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=2))
    status.goodput = GoodputStatus(since="2026-01-01T11:50:00.000Z", progress_reported=True)
    return status


@pytest.mark.parametrize("step_at, start, last_step", [
    (0.7, "2026-01-01T12:00:00.700Z", 300),  # killed at 0.7 s or after: finishedAt says 12:00:00
    (-0.5, "2026-01-01T12:00:00Z", 305),  # the report came before the second began: carried to the fault
])
def test_a_killed_pods_incident_starts_at_the_last_step_within_its_finished_second(step_at, start, last_step):
    progress = ProgressView(pod="train-worker-1", started_at=NOW - timedelta(minutes=5), step=300,
                            step_at=at(step_at), step_seconds=0.1)
    job = factory.job(running().model_dump(by_alias=True, mode="json"))
    plan = planner.plan(job, observed([worker(0), failed(1, exit_code=137, ago=0.0), rdzv()],
                                      store=store(progress=progress)), at(1.2))
    incident = plan.status.goodput.open_incident
    assert (incident.kind, incident.start_time, incident.last_step) == ("Rank0Lost", start, last_step)
