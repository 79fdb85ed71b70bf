"""The PodGroup the workers join, kept at minReplicas. Pure.

The operator has no watch on PodGroups: the handler reads the group once (and again after the operator
changed it, or every few minutes) and hands it over as `Gang.pod_group` (in Observed.integrations).

When minReplicas changes: Coscheduling's minMember is updated in place. The Workload API's gang policy is
immutable, and its PodGroup carries the finalizer scheduling.k8s.io/podgroup-protection, which keeps a deleted
group until no pod refers to it any more (and a pod's spec.schedulingGroup is immutable): so the group is
deleted and made again once no worker pod of the job is left (the job suspended and resumed, or queued again
by Kueue). Until then replacements and scale-ups join the existing group; its old minimum is already met by
the pods bound before them, so they schedule one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from elasticjob.domain import Settings
from elasticjob.gang import podgroup
from elasticjob.gang.actions import PatchPodGroup
from elasticjob.gang.podgroup import PodGroupView
from elasticjob.planner.base import (
    Allowance,
    CreateObject,
    DeleteObject,
    Event,
    Job,
    Observed,
    Plan,
)


@dataclass(frozen=True)
class Gang:
    """The gang as the planner calls it (planner.base.Integration), with the job's group as the controller last
    read or made it (`pod_group`)."""

    pod_group: PodGroupView | None = None

    def gate(self, plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> Allowance:
        """Never holds a job: its pods only join the group (and go to the gang's scheduler)."""
        return Allowance(worker=podgroup.worker_placement(job.ref), store=podgroup.store_placement(job.ref))

    def ready_for_workers(self, plan: Plan, job: Job, observed: Observed) -> bool:
        return ensure_gang(plan, job, observed, self.pod_group)

    def finish(self, plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> None:
        return None  # the group goes with the job (owner reference)


def ensure_gang(plan: Plan, job: Job, observed: Observed, have: PodGroupView | None) -> bool:
    """Make the job's PodGroup what the spec says (`have`: as last read); whether workers may be created now."""
    want = podgroup.desired(job.ref)
    if want is None:
        return True
    if have is None:
        what = "gang.minCount" if want.api_version == podgroup.WORKLOAD_API else "minMember"
        plan.act(CreateObject(podgroup.pod_group(job.ref, want), Event(
            "Normal", "CreatedPodGroup", f"created PodGroup {want.name} ({want.api_version}) with {what} "
            f"{want.min_member}: {want.min_member} workers start together, more join one by one"),
            plural=podgroup.PLURAL))
        return True  # created before the pods in the same apply (objects first)
    if have.owner_uid != job.ref.uid or have.deleting:
        plan.soon(2)  # an earlier job's group the garbage collector is removing, or ours on its way out
        return False
    if have.same_policy(want):
        return True
    if want.api_version == podgroup.COSCHEDULING_API:
        plan.act(PatchPodGroup(have.api_version, have.name, {"spec": {
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
