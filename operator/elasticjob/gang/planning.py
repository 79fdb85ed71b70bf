"""The PodGroup the workers join, kept at minReplicas. Pure.

The operator has no watch on PodGroups: the handler reads the group once (and again after the operator
changed it, or every few minutes) and hands it over as `Observed.pod_group`.

When minReplicas changes: Coscheduling's minMember is updated in place. The Workload API's gang policy is
immutable, and its PodGroup carries the finalizer scheduling.k8s.io/podgroup-protection, which keeps a deleted
group until no pod refers to it any more (and a pod's spec.schedulingGroup is immutable): so the group is
deleted and made again once no worker pod of the job is left (the job suspended and resumed, or queued again
by Kueue). Until then replacements and scale-ups join the existing group; its old minimum is already met by
the pods bound before them, so they schedule one by one.
"""

from __future__ import annotations

from elasticjob.gang import podgroup
from elasticjob.planner.base import CreateObject, DeleteObject, Event, Job, Observed, PatchObject, Plan


def ensure_gang(plan: Plan, job: Job, observed: Observed) -> bool:
    """Make the job's PodGroup what the spec says; whether workers may be created now."""
    want = podgroup.desired(job.ref)
    have = observed.pod_group
    if want is None:
        return True
    if have is None:
        what = "gang.minCount" if want.api_version == podgroup.WORKLOAD_API else "minMember"
        plan.act(CreateObject(podgroup.pod_group(job.ref, want), Event(
            "Normal", "CreatedPodGroup", f"created PodGroup {want.name} ({want.api_version}) with {what} "
            f"{want.min_member}: {want.min_member} workers start together, more join one by one")))
        return True  # created before the pods in the same apply (objects first)
    if have.owner_uid != job.ref.uid or have.deleting:
        plan.soon(2)  # an earlier job's group the garbage collector is removing, or ours on its way out
        return False
    if have.same_policy(want):
        return True
    if want.api_version == podgroup.COSCHEDULING_API:
        plan.act(PatchObject(have.api_version, "PodGroup", podgroup.PLURAL, have.name, {"spec": {
            "minMember": want.min_member, "scheduleTimeoutSeconds": want.timeout_seconds}}, Event(
            "Normal", "UpdatedPodGroup", f"PodGroup {have.name}: minMember {have.min_member} -> {want.min_member}")))
        return True
    if observed.workers:
        return True  # the group is protected while pods refer to it: made again when the workers start anew
    plan.act(DeleteObject(have.api_version, "PodGroup", podgroup.PLURAL, have.name, have.uid, Event(
        "Normal", "RecreatingPodGroup", f"PodGroup {have.name} has gang.minCount {have.min_member}, minReplicas "
        f"is {want.min_member}: deleting it to create it again")))
    plan.soon(1)
    return False
