"""Gang scheduling of a job's workers: the PodGroup of either API, and how a worker joins it. Pure.

The gang's minimum is minReplicas: that many workers are bound together or none is, so nothing sits
half-started on scarce nodes; workers above it (scale-ups, replacements of failed ones) join the same group
and schedule one by one, since the group's minimum is already met by the pods bound before them.

The rendezvous store pod is outside the gang: it must run before the workers (their agents connect to it),
it is replaced alone when lost, it holds no accelerator, and it must not count towards minMember. With
Coscheduling it still goes to the same scheduler as the workers: two schedulers placing pods on the same
nodes can each count the same free capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticjob import naming
from elasticjob.builders import owner_reference
from elasticjob.domain import JobRef, Placement
from elasticjob.gang import names as gang_names
from elasticjob.models import ElasticJobSpec, GangMode

WORKLOAD_API = "scheduling.k8s.io/v1alpha2"
COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
API_OF = {GangMode.WORKLOAD: WORKLOAD_API, GangMode.COSCHEDULING: COSCHEDULING_API}
PLURAL = "podgroups"


@dataclass(frozen=True, slots=True)
class PodGroupView:
    """A PodGroup as the operator last read or made it."""

    api_version: str
    name: str
    min_member: int
    timeout_seconds: int | None = None
    uid: str = ""
    owner_uid: str | None = None
    deleting: bool = False

    def same_policy(self, other: PodGroupView) -> bool:
        return (self.api_version, self.name, self.min_member, self.timeout_seconds) == (
            other.api_version, other.name, other.min_member, other.timeout_seconds)


def api_version(spec: ElasticJobSpec) -> str | None:
    return API_OF.get(spec.scheduling.gang)


def scheduler_name(spec: ElasticJobSpec) -> str | None:
    """The scheduler of all the job's pods: Coscheduling needs scheduler-plugins' (unless named otherwise)."""
    if spec.scheduling.gang != GangMode.COSCHEDULING:
        return None
    own = (spec.template.get("spec") or {}).get("schedulerName")
    return spec.scheduling.scheduler_name or own or gang_names.COSCHEDULING_SCHEDULER


def desired(job: JobRef) -> PodGroupView | None:
    api = api_version(job.spec)
    if api is None:
        return None
    timeout = job.spec.scheduling.schedule_timeout_seconds if api == COSCHEDULING_API else None
    return PodGroupView(api, gang_names.pod_group_name(job.name), job.spec.min_replicas, timeout)


def pod_group(job: JobRef, want: PodGroupView) -> dict[str, Any]:
    """The manifest: gang.minCount (the Workload API; immutable, so a change means a new group) or minMember."""
    if want.api_version == WORKLOAD_API:
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": want.min_member}}}
    else:
        spec = {"minMember": want.min_member}
        if want.timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = want.timeout_seconds
    return {
        "apiVersion": want.api_version,
        "kind": "PodGroup",
        "metadata": {"name": want.name, "namespace": job.namespace, "labels": naming.job_labels(job.name),
                     "ownerReferences": [owner_reference(job)]},
        "spec": spec,
    }


def pod_group_view(body: Mapping[str, Any]) -> PodGroupView:
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    if "minMember" in spec or body.get("apiVersion") == COSCHEDULING_API:
        minimum, timeout = spec.get("minMember", 0), spec.get("scheduleTimeoutSeconds")
    else:
        minimum, timeout = ((spec.get("schedulingPolicy") or {}).get("gang") or {}).get("minCount", 0), None
    owner = next((r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    return PodGroupView(api_version=body.get("apiVersion", ""), name=meta.get("name", ""), min_member=int(minimum),
                        timeout_seconds=timeout, uid=meta.get("uid", ""), owner_uid=owner,
                        deleting=meta.get("deletionTimestamp") is not None)


def worker_placement(job: JobRef) -> Placement:
    """How a worker joins the gang: spec.schedulingGroup (the Workload API), or Coscheduling's label and
    scheduler."""
    mode, group = job.spec.scheduling.gang, gang_names.pod_group_name(job.name)
    if mode == GangMode.WORKLOAD:
        return Placement(scheduling_group=group)
    if mode == GangMode.COSCHEDULING:
        return Placement(labels=((gang_names.COSCHEDULING_LABEL, group),), scheduler_name=scheduler_name(job.spec))
    return Placement()


def store_placement(job: JobRef) -> Placement:
    """The store pod is in no gang, but with Coscheduling it goes to the same scheduler as the workers."""
    return Placement(scheduler_name=scheduler_name(job.spec))
