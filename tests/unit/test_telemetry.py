"""Metrics derived from what a reconcile changed (the real prometheus_client registry, read back)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY

from elasticjob.controller import telemetry
from elasticjob.models import ElasticJobStatus

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
META = {"namespace": "ml", "name": "t", "uid": "u", "creationTimestamp": "2026-01-01T11:59:50Z"}


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def status(**fields) -> ElasticJobStatus:
    return ElasticJobStatus.model_validate(fields)


def test_restarts_infrastructure_failures_and_scale_events_are_counted_from_the_change():
    before = (value("elasticjob_restarts_total"), value("elasticjob_infrastructure_failures_total", reason="Evicted"),
              value("elasticjob_scale_events_total", direction="down"))
    old = status(restarts=1, desiredReplicas=3, lastFailures=[{"pod": "a", "uid": "1", "reason": "Error"}])
    new = status(restarts=2, desiredReplicas=2, lastFailures=[
        {"pod": "a", "uid": "1", "reason": "Error"}, {"pod": "b", "uid": "2", "reason": "Evicted", "charged": False}])
    telemetry.record(META, old, new, NOW)
    after = (value("elasticjob_restarts_total"), value("elasticjob_infrastructure_failures_total", reason="Evicted"),
             value("elasticjob_scale_events_total", direction="down"))
    assert [b - a for a, b in zip(before, after)] == [1, 1, 1]


def test_time_to_running_is_observed_once_from_creation():
    count = value("elasticjob_time_to_running_seconds_count")
    running = status(phase="Running", conditions=[{"type": "Running", "status": "True", "reason": "Running"}])
    telemetry.record(META, status(), running, NOW)
    telemetry.record(META, running, running, NOW + timedelta(seconds=5))
    assert value("elasticjob_time_to_running_seconds_count") == count + 1
    assert value("elasticjob_time_to_running_seconds_bucket", le="10.0") >= 1


def closed(*incidents: dict) -> ElasticJobStatus:
    return status(goodput={"since": "2026-01-01T11:00:00Z", "incidents": len(incidents),
                           "lastIncidents": list(incidents)})


def incident(kind: str, start: float, round_at: float | None, end: float) -> dict:
    def at(seconds: float) -> str:
        return (NOW + timedelta(seconds=seconds)).isoformat()
    return {"kind": kind, "startTime": at(start), "roundTime": at(round_at) if round_at is not None else None,
            "endTime": at(end)}


def test_recovery_is_each_closed_incident_from_its_fault_to_the_group_formed_again():
    count, fast = value("elasticjob_recovery_seconds_count"), value("elasticjob_recovery_seconds_bucket", le="5.0")
    lost = incident("WorkerLost", 0, 4, 6)
    # Doubled: the same closed incident seen again (the next reconcile, or the replica that took over) counts once.
    telemetry.record(META, status(), closed(lost), NOW)
    telemetry.record(META, closed(lost), closed(lost), NOW)
    assert value("elasticjob_recovery_seconds_count") == count + 1
    assert value("elasticjob_recovery_seconds_bucket", le="5.0") == fast + 1
    # No round seen: to the training's next step; a suspension's time is its wait, not a recovery.
    telemetry.record(META, closed(lost), closed(lost, incident("Rejoin", 10, None, 11),
                                                 incident("Suspend", 20, 90, 95)), NOW)
    assert value("elasticjob_recovery_seconds_count") == count + 2
    assert value("elasticjob_recovery_seconds_bucket", le="5.0") == fast + 2


def test_jobs_by_phase_and_per_job_series_only_while_unfinished():
    from elasticjob import metrics

    metrics.observe_job("ml", "a", "Running", 0)
    metrics.observe_job("ml", "b", "Running", 2, goodput=97.25, weighted=91.5)
    assert value("elasticjob_jobs", phase="Running") >= 2
    assert value("elasticjob_job_restarts", namespace="ml", job="b") == 2
    assert value("elasticjob_job_goodput_percent", namespace="ml", job="b") == 97.25
    assert value("elasticjob_job_weighted_goodput_percent", namespace="ml", job="b") == 91.5
    assert REGISTRY.get_sample_value("elasticjob_job_goodput_percent", {"namespace": "ml", "job": "a"}) is None
    metrics.observe_job("ml", "b", "Succeeded", 2)
    assert REGISTRY.get_sample_value("elasticjob_job_restarts", {"namespace": "ml", "job": "b"}) is None
    assert REGISTRY.get_sample_value("elasticjob_job_goodput_percent", {"namespace": "ml", "job": "b"}) is None
    assert REGISTRY.get_sample_value("elasticjob_job_weighted_goodput_percent", {"namespace": "ml", "job": "b"}) \
        is None
    assert value("elasticjob_jobs", phase="Succeeded") >= 1
    metrics.forget_job("ml", "a")
    assert REGISTRY.get_sample_value("elasticjob_job_phase", {"namespace": "ml", "job": "a", "phase": "Running"}) is None


def test_the_fleet_gauge_counts_each_job_once_in_its_latest_phase():
    from elasticjob import metrics

    def counts():
        return {phase: value("elasticjob_jobs", phase=phase) for phase in metrics.PHASES}

    before = counts()
    metrics.observe_job("fleet", "a", "Pending", 0)
    metrics.observe_job("fleet", "a", "Pending", 0)  # observed again: not counted twice
    metrics.observe_job("fleet", "b", "Pending", 0)
    metrics.observe_job("fleet", "a", "Running", 0)
    metrics.observe_job("fleet", "b", "Failed", 1)
    metrics.forget_job("fleet", "b")
    metrics.forget_job("fleet", "never-seen")
    moved = {phase: counts()[phase] - before[phase] for phase in metrics.PHASES}
    assert moved == {**{phase: 0 for phase in metrics.PHASES}, "Running": 1}
    metrics.forget_job("fleet", "a")
    assert counts() == before
