"""What the gang's objects and labels are called (the core names none of them)."""

from __future__ import annotations

# scheduler-plugins' Coscheduling: a pod joins a PodGroup by this label.
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"


def pod_group_name(job: str) -> str:
    """The gang of the job's workers (either API); the store pod is not in it."""
    return f"{job}-workers"
