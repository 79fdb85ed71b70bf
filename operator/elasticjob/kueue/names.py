"""What Kueue's objects and labels are called, as this integration uses them (the core names none of them)."""

from __future__ import annotations

import hashlib

from elasticjob.models import GROUP, KIND

# Kueue manages a job carrying this label (the LocalQueue's name); the optional priority label names a
# WorkloadPriorityClass, as for Kueue's own integrations.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PODSET_LABEL = "kueue.x-k8s.io/podset"
PODSET_WORKERS = "workers"
PODSET_STORE = "store"


def workload_name(job: str, uid: str) -> str:
    """Kueue's own scheme for a job's Workload (jobframework GetWorkloadNameForOwnerWithGVK): the kind and
    name, then 5 hex digits of a hash of kind, group, name and uid, so a recreated job gets a new one."""
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job}\n{uid}".encode()).hexdigest()[:5]
    return f"{KIND.lower()}-{job}"[:253 - 6] + f"-{digest}"
