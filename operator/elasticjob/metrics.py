"""Prometheus metrics of the operator (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter("elasticjob_reconciles_total", "Reconciles of ElasticJobs", ["result"])
RECONCILE_SECONDS = Histogram("elasticjob_reconcile_seconds", "Time of one reconcile of one job")
ACTIONS = Counter("elasticjob_actions_total", "Actions applied to the cluster", ["action"])
STORE_ACTIONS = Counter("elasticjob_store_actions_total", "Control requests to the jobs' rendezvous stores",
                        ["action", "result"])
JOB_PHASE = Gauge("elasticjob_job_phase", "1 for the phase each job is in", ["namespace", "job", "phase"])
RESTARTS = Gauge("elasticjob_job_restarts", "Worker-group restarts charged to a job", ["namespace", "job"])

PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")


def observe_job(namespace: str, job: str, phase: str, restarts: int) -> None:
    for name in PHASES:
        JOB_PHASE.labels(namespace, job, name).set(1 if name == phase else 0)
    RESTARTS.labels(namespace, job).set(restarts)


def forget_job(namespace: str, job: str) -> None:
    label_sets = [(JOB_PHASE, (namespace, job, name)) for name in PHASES] + [(RESTARTS, (namespace, job))]
    for metric, labels in label_sets:
        try:
            metric.remove(*labels)
        except KeyError:
            pass


def serve(port: int) -> None:
    start_http_server(port)
