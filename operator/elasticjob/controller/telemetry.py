"""Metrics from what a reconcile changed: restarts, infrastructure failures, scale events, time to Running, and,
for each incident the downtime ledger closed, its recovery time (the fault -> the store reported the worker group
formed again) and the seconds it lost per phase. Nothing is kept here between reconciles: the ledger in the job's
status is the one record of an incident, so the replica that takes over the Lease goes on from it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from elasticjob import metrics
from elasticjob.models import ElasticJobStatus, Incident, Phase
from elasticjob.observe import parse_time
from elasticjob.planner.failures import INFRASTRUCTURE_REASONS
from elasticjob.planner.goodput import PHASE_NAMES, wire_name
from elasticjob.planner.ledger import STOPS_EVERY_WORKER


def record(meta: dict[str, Any], old: ElasticJobStatus, new: ElasticJobStatus, now: datetime) -> None:
    if new.restarts > old.restarts:
        metrics.RESTARTS.inc(new.restarts - old.restarts)
    seen = {f.uid for f in old.last_failures}
    fresh = [f for f in new.last_failures if f.uid not in seen]
    for failure in fresh:
        if failure.reason in INFRASTRUCTURE_REASONS and not failure.charged:
            metrics.INFRASTRUCTURE_FAILURES.labels(failure.reason).inc()
    scaled = old.desired_replicas and new.desired_replicas != old.desired_replicas
    if scaled:
        metrics.SCALE_EVENTS.labels("up" if new.desired_replicas > old.desired_replicas else "down").inc()
    if new.phase == Phase.RUNNING and not any(c.type == "Running" and c.status == "True" for c in old.conditions) \
            and old.restarts == 0 and not old.last_failures and (created := parse_time(meta.get("creationTimestamp"))):
        metrics.TIME_TO_RUNNING.observe((now - created).total_seconds())
    for incident in closed_now(old, new):
        lost_per_phase(incident)
        recovery_seconds(incident)


def closed_now(old: ElasticJobStatus, new: ElasticJobStatus) -> list[Incident]:
    """The incidents the ledger closed in this reconcile, each once (the count in status moves once per close)."""
    before = old.goodput.incidents if old.goodput else 0
    if new.goodput is None or new.goodput.incidents <= before:
        return []
    return new.goodput.last_incidents[-(new.goodput.incidents - before):]


def lost_per_phase(incident: Incident) -> None:
    for name in PHASE_NAMES:
        seconds = getattr(incident.phases, name) if incident.phases else None
        if seconds is not None:
            metrics.LOST_SECONDS.labels(wire_name(name)).observe(seconds)


def recovery_seconds(incident: Incident) -> None:
    """From the fault to the group formed again (or, where no round was seen, to the training's next step). A
    suspension or a preemption is not a recovery: its time is the wait to run again."""
    start = parse_time(incident.start_time)
    end = parse_time(incident.round_time or incident.end_time)
    if incident.kind in STOPS_EVERY_WORKER or start is None or end is None or end < start:
        return
    metrics.RECOVERY_SECONDS.observe((end - start).total_seconds())
