"""The PodGroup the workers join, kept at minReplicas. Pure.

The operator has no watch on PodGroups: the handler reads the group once (and again after the operator
changed it, or every few minutes) and hands it over as `Observed.pod_group`. A group whose minimum is wrong is
deleted and made again (the Workload API's gang policy is immutable; Coscheduling's is recreated the same
way): pods already bound are not affected, pods still pending wait for the new group.
"""

from __future__ import annotations

from elasticjob import gang
from elasticjob.planner.base import CreateObject, DeleteObject, Event, Job, Observed, Plan


def ensure_gang(plan: Plan, job: Job, observed: Observed) -> bool:
    """Make the job's PodGroup what the spec says; whether workers may be created now."""
    want = gang.desired(job.ref)
    have = observed.pod_group
    if want is None:
        return True
    if have is None:
        what = "gang.minCount" if want.api_version == gang.WORKLOAD_API else "minMember"
        plan.act(CreateObject(gang.pod_group(job.ref, want), Event(
            "Normal", "CreatedPodGroup", f"created PodGroup {want.name} ({want.api_version}) with {what} "
            f"{want.min_member}: {want.min_member} workers start together, more join one by one")))
        return True  # created before the pods in the same apply (objects first)
    if have.owner_uid != job.ref.uid or have.deleting:
        plan.soon(2)  # an earlier job's group the garbage collector is removing, or ours on its way out
        return False
    if not have.same_policy(want):
        plan.act(DeleteObject(have.api_version, "PodGroup", gang.PLURAL, have.name, have.uid, Event(
            "Normal", "RecreatingPodGroup", f"PodGroup {have.name} has minimum {have.min_member}, minReplicas is "
            f"{want.min_member}: deleting it to create it again")))
        plan.soon(1)
        return False
    return True
