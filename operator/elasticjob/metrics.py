"""Prometheus metrics of the operator (served on --metrics-port). charts/.../dashboards/ queries these names.

Fleet-wide series have no job label: a thousand jobs cost the same handful of series. Per-job series exist
only while a job is not finished, and go with it.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# Counted in the client layer, where every request passes (rest.call); named here with the others.
from elasticjob.rest import REQUESTS as API_REQUESTS  # noqa: F401

RECONCILES = Counter("elasticjob_reconciles_total", "Reconciles of ElasticJobs", ["result"])
RECONCILE_SECONDS = Histogram("elasticjob_reconcile_seconds", "Time of one reconcile of one job")
ACTIONS = Counter("elasticjob_actions_total", "Actions applied to the cluster", ["action"])
STORE_ACTIONS = Counter("elasticjob_store_actions_total", "Control requests to the jobs' rendezvous stores",
                        ["action", "result"])
JOBS = Gauge("elasticjob_jobs", "Jobs by phase", ["phase"])
RESTARTS = Counter("elasticjob_restarts_total", "Worker-group restarts charged to jobs' maxRestarts")
INFRASTRUCTURE_FAILURES = Counter("elasticjob_infrastructure_failures_total",
                                  "Pods lost to evictions, preemptions, lost nodes and partitions", ["reason"])
SCALE_EVENTS = Counter("elasticjob_scale_events_total", "Changes of a job's desired workers", ["direction"])
TIME_TO_RUNNING = Histogram("elasticjob_time_to_running_seconds", "From a job's creation to its first Running",
                            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800))
RECOVERY_SECONDS = Histogram("elasticjob_recovery_seconds",
                             "From a fault to the worker group formed again, per incident the downtime ledger closed",
                             buckets=(1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300))
LOST_SECONDS = Histogram("elasticjob_lost_seconds", "Training seconds lost per closed incident, by phase of the "
                         "downtime ledger (detect, replace, rendezvous, workerStart, checkpointLoad, recompute; the "
                         "phases the operator could not see are not observed)", ["phase"],
                         buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300))
JOB_PHASE = Gauge("elasticjob_job_phase", "1 for the phase each unfinished job is in", ["namespace", "job", "phase"])
JOB_RESTARTS = Gauge("elasticjob_job_restarts", "Restarts charged to each unfinished job", ["namespace", "job"])
JOB_GOODPUT = Gauge("elasticjob_job_goodput_percent", "Each unfinished job's ETTR (status.goodput.goodputPercent): "
                    "percent of its wall time spent training, as of its ledger's last account; absent before one",
                    ["namespace", "job"])
JOB_WEIGHTED_GOODPUT = Gauge("elasticjob_job_weighted_goodput_percent", "Each unfinished job's ETTR weighted by the "
                             "nodes that trained over the nodes wanted (status.goodput.weightedGoodputPercent); "
                             "absent before the ledger's first account", ["namespace", "job"])
# 1 while this replica holds the Lease and reconciles (always, without --leader-elect); 0 while it waits idle.
LEADER = Gauge("elasticjob_operator_leader", "1 if this operator replica is the leader and reconciles")

PHASES = ("Pending", "Queued", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
FINISHED = ("Succeeded", "Failed")

_phases: dict[tuple[str, str], str] = {}
for _name in PHASES:  # every phase's series exists from the start, at 0 (the dashboard's stacked panel)
    JOBS.labels(_name)


def observe_job(namespace: str, job: str, phase: str, restarts: int, goodput: float | None = None,
                weighted: float | None = None) -> None:
    """The job's phase now: the fleet gauge, and the per-job series while it is unfinished."""
    _move((namespace, job), phase)
    if phase in FINISHED:
        _forget_series(namespace, job)
        return
    for name in PHASES:
        JOB_PHASE.labels(namespace, job, name).set(1 if name == phase else 0)
    JOB_RESTARTS.labels(namespace, job).set(restarts)
    if goodput is not None:
        JOB_GOODPUT.labels(namespace, job).set(goodput)
    if weighted is not None:
        JOB_WEIGHTED_GOODPUT.labels(namespace, job).set(weighted)


def forget_job(namespace: str, job: str) -> None:
    _move((namespace, job), None)
    _forget_series(namespace, job)


def _move(key: tuple[str, str], phase: str | None) -> None:
    """The fleet gauge follows one job's move. Every reconcile observes its job: counting the whole fleet each
    time cost n steps per reconcile at n jobs (7% of the operator's CPU at 3,000 jobs on kwok, and growing)."""
    before = _phases.pop(key, None) if phase is None else _phases.get(key)
    if before == phase:
        return
    if phase is not None:
        _phases[key] = phase
        JOBS.labels(phase).inc()
    if before is not None:
        JOBS.labels(before).dec()


def _forget_series(namespace: str, job: str) -> None:
    label_sets = [(JOB_PHASE, (namespace, job, name)) for name in PHASES] + [
        (JOB_RESTARTS, (namespace, job)), (JOB_GOODPUT, (namespace, job)),
        (JOB_WEIGHTED_GOODPUT, (namespace, job))]
    for metric, labels in label_sets:
        try:
            metric.remove(*labels)
        except KeyError:
            pass


def serve(port: int) -> None:
    start_http_server(port)
