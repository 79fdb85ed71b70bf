"""Names, labels and keys: built here and nowhere else, so that creating and finding always agree."""

from __future__ import annotations

import hashlib

from elasticjob.models import GROUP, KIND

JOB_LABEL = f"{GROUP}/job-name"
ROLE_LABEL = f"{GROUP}/role"
INDEX_LABEL = f"{GROUP}/replica-index"
# status.restarts when the pod was created: tells a failure of the last incident from a new one.
RESTART_GENERATION_ANNOTATION = f"{GROUP}/restart-generation"
# Which making of a pod's name it is, and the operator's HMAC over job, name and that number (planner/ownership.py).
SERIAL_ANNOTATION = f"{GROUP}/serial"
MARK_ANNOTATION = f"{GROUP}/mark"
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


def alternate_name(name: str, uid: str) -> str:
    """A pod's name while an earlier job of the same name still holds the usual one (its pods terminating after
    `kubectl delete -f job.yaml && kubectl apply -f job.yaml`): the usual name and 5 characters of the uid."""
    return f"{name}-{uid[:5]}"


def job_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job}


def worker_labels(job: str, index: int) -> dict[str, str]:
    return {JOB_LABEL: job, ROLE_LABEL: ROLE_WORKER, INDEX_LABEL: str(index)}


def rendezvous_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job, ROLE_LABEL: ROLE_RENDEZVOUS}


def worker_selector(job: str) -> str:
    return f"{JOB_LABEL}={job},{ROLE_LABEL}={ROLE_WORKER}"


# --- gangs and queues ---------------------------------------------------------------------------------------

# Kueue manages a job carrying this label (the LocalQueue's name); the optional priority label names a
# WorkloadPriorityClass, as for Kueue's own integrations.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PODSET_LABEL = "kueue.x-k8s.io/podset"
PODSET_WORKERS = "workers"
PODSET_STORE = "store"
# scheduler-plugins' Coscheduling: a pod joins a PodGroup by this label.
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"


def pod_group_name(job: str) -> str:
    """The gang of the job's workers (either API); the store pod is not in it."""
    return f"{job}-workers"


def workload_name(job: str, uid: str) -> str:
    """Kueue's own scheme for a job's Workload (jobframework GetWorkloadNameForOwnerWithGVK): the kind and
    name, then 5 hex digits of a hash of kind, group, name and uid, so a recreated job gets a new one."""
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job}\n{uid}".encode()).hexdigest()[:5]
    return f"{KIND.lower()}-{job}"[:253 - 6] + f"-{digest}"
