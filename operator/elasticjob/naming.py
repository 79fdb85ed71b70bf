"""Names, labels and keys: built here and nowhere else, so that creating and finding always agree."""

from __future__ import annotations

from elasticjob.models import GROUP

JOB_LABEL = f"{GROUP}/job-name"
ROLE_LABEL = f"{GROUP}/role"
INDEX_LABEL = f"{GROUP}/replica-index"
# status.restarts when the pod was created: tells a failure of the last incident from a new one.
RESTART_GENERATION_ANNOTATION = f"{GROUP}/restart-generation"
ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"
WORKER_CONTAINER = "worker"
RENDEZVOUS_CONTAINER = "rendezvous"
FINALIZER_PREFIX = GROUP


def job_key(namespace: str, name: str) -> tuple[str, str]:
    return (namespace, name)


def worker_pod_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def rendezvous_name(job: str) -> str:
    """Name of both the rendezvous pod and its Service."""
    return f"{job}-rdzv"


def job_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job}


def worker_labels(job: str, index: int) -> dict[str, str]:
    return {JOB_LABEL: job, ROLE_LABEL: ROLE_WORKER, INDEX_LABEL: str(index)}


def rendezvous_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job, ROLE_LABEL: ROLE_RENDEZVOUS}


def worker_selector(job: str) -> str:
    return f"{JOB_LABEL}={job},{ROLE_LABEL}={ROLE_WORKER}"
