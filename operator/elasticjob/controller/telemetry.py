"""Metrics from what a reconcile changed: restarts, infrastructure failures, scale events, time to Running,
recovery time (a failure or membership change -> the store reports the worker group formed again), and the
seconds each closed incident of the downtime ledger lost per phase."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from elasticjob import metrics
from elasticjob.models import ElasticJobStatus, Phase
from elasticjob.observe import StoreView, parse_time
from elasticjob.planner.failures import INFRASTRUCTURE_REASONS
from elasticjob.planner.goodput import PHASE_NAMES, wire_name


@dataclass
class Disruption:
    at: datetime
    round: int | None  # the round running when it happened: recovered once a later one is complete


_open: dict[tuple[str, str], Disruption] = {}  # job key -> the disruption not yet recovered from


def record(meta: dict[str, Any], old: ElasticJobStatus, new: ElasticJobStatus, store: StoreView | None,
           now: datetime) -> None:
    key = (meta["namespace"], meta["name"])
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
    if (fresh or scaled) and key not in _open:
        _open[key] = Disruption(now, store.round if store else None)
    recovered(key, store, now)
    lost_per_phase(old, new)
    if new.phase.finished:
        _open.pop(key, None)


def recovered(key: tuple[str, str], store: StoreView | None, now: datetime) -> None:
    disruption = _open.get(key)
    if disruption is None or store is None or not store.complete or store.round is None:
        return
    if disruption.round is None or store.round > disruption.round:
        metrics.RECOVERY_SECONDS.observe((now - disruption.at).total_seconds())
        del _open[key]


def lost_per_phase(old: ElasticJobStatus, new: ElasticJobStatus) -> None:
    """Each incident the ledger closed in this reconcile, once: its known phases into the histogram."""
    closed = new.goodput.incidents if new.goodput else 0
    if closed <= (old.goodput.incidents if old.goodput else 0) or new.goodput is None:
        return
    for incident in new.goodput.last_incidents[-(closed - (old.goodput.incidents if old.goodput else 0)):]:
        for name in PHASE_NAMES:
            seconds = getattr(incident.phases, name) if incident.phases else None
            if seconds is not None:
                metrics.LOST_SECONDS.labels(wire_name(name)).observe(seconds)


def forget(key: tuple[str, str]) -> None:
    _open.pop(key, None)
