"""A job under Kueue grows and shrinks through workload slices (Kueue's ElasticJobsViaWorkloadSlices, KEP 77).
Pure.

As Kueue's jobframework does for the jobs it integrates (pkg/workloadslicing):
- more replicas than the admitted slice holds: a new Workload replaces it (annotation
  workload-slice-replacement-for). Kueue charges the new slice only what the old one does not hold, and once it
  admits the new one marks the old Finished (WorkloadSliceReplaced). Until then the job runs at what was
  admitted: no pod is made for a worker Kueue has not admitted, and the running world is left alone;
- fewer: the admitted slice's workers' count shrinks in place, which releases the quota at once;
- a pending slice the spec no longer needs is deleted (only while Kueue has not touched it since it was read).
The job's first Workload is the one admission.py makes (with partial admission down to minReplicas); slices
follow it.
"""

from __future__ import annotations

import re
from datetime import datetime

from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import view, workloads
from elasticjob.kueue.actions import ApplyWorkloadStatus, PatchWorkload
from elasticjob.kueue.view import admission_of
from elasticjob.kueue.workloads import WorkloadView
from elasticjob.planner.base import CreateObject, DeleteObject, Event, Job, Observed, Plan


def resize(plan: Plan, job: Job, observed: Observed, active: WorkloadView, admitted: int, now: datetime,
           kit_image: str | None) -> int:
    """The workers the job may run now, under its admitted slice `active` (which holds `admitted`)."""
    finish_replaced(plan, observed, active, now)
    desired = job.ref.spec.desired_pods  # the workers' podset holds the spares too
    pending = [w for w in own(observed) if not w.finished and not w.quota_reserved and not w.deleting
               and w.name != active.name]
    keep = pending[-1] if desired > admitted and pending and pending[-1].replaces == active.key else None
    for extra in pending:
        if extra is not keep:
            plan.act(DeleteObject(workloads.API_VERSION, "Workload", workloads.WORKLOADS, extra.name, extra.uid,
                                  resource_version=extra.resource_version))
    admission = admission_of(plan)
    admission.requested = None
    if desired < admitted:
        if (active.pod_set(kueue_names.PODSET_WORKERS) or (0, None))[0] != desired:
            plan.act(PatchWorkload(active.name, active.resource_version, workloads.with_workers(active, desired),
                                   active.queue_name or "", Event(
                                       "Normal", "ScaledDown", f"Workload {active.name} shrunk in place from "
                                       f"{admitted} to {desired} workers: Kueue releases the rest of its quota")))
        return desired
    if desired == admitted:
        return admitted
    admission.requested = desired
    if keep is None:
        name = next_slice_name(job, observed)
        priority = view.of(observed).priority
        plan.act(CreateObject(workloads.workload_slice(job.ref, active.queue_name or "", priority, kit_image,
                                                   desired, active, name), Event(
            "Normal", "ScalingUp", f"asked Kueue for {desired} workers: Workload {name} replaces {active.name} "
            f"({admitted} workers) once admitted; until then the job runs {admitted}"), plural=workloads.WORKLOADS))
        admission.message = f"{admitted} workers admitted; {desired} asked of Kueue in Workload {name}"
    else:
        if (keep.pod_set(kueue_names.PODSET_WORKERS) or (0, None))[0] != desired:
            plan.act(PatchWorkload(keep.name, keep.resource_version, workloads.with_workers(keep, desired),
                                   keep.queue_name or ""))
        reserved = keep.condition("QuotaReserved") or {}
        why = reserved.get("message") or "Kueue has not looked at it yet"
        admission.message = (f"{admitted} workers admitted; {desired} asked of Kueue in Workload {keep.name}, "
                             f"not admitted: {why}")
    return admitted


def own(observed: Observed) -> list[WorkloadView]:
    """The job's Workloads, oldest first."""
    return sorted(view.of(observed).workloads, key=lambda w: w.created)


def finish_replaced(plan: Plan, observed: Observed, active: WorkloadView, now: datetime) -> None:
    """A slice that an admitted one replaces is Finished: Kueue's scheduler does it as it admits the new one, and
    leaves it to the job's controller when that write fails."""
    for old in own(observed):
        if old.key == active.replaces and not old.finished and not old.deleting:
            plan.act(ApplyWorkloadStatus(old.name, workloads.finish(
                old, True, f"replaced by Workload {active.name}", now, reason=workloads.SLICE_REPLACED)))


def next_slice_name(job: Job, observed: Observed) -> str:
    """`<the job's Workload>-s<n>`, n above every slice of the job seen, finished ones included: a name is never
    reused, and two plans from the same view ask for the same one (the second is refused as existing)."""
    base = kueue_names.workload_name(job.ref.name, job.ref.uid)
    pattern = re.compile(re.escape(base) + r"-s(\d+)$")
    seen = [int(m.group(1)) for w in own(observed) if (m := pattern.match(w.name))]
    return f"{base}-s{max(seen, default=0) + 1}"


def drop_pending(plan: Plan, observed: Observed) -> None:
    """The job stops (evicted, finished, suspended): slices Kueue has not admitted are no longer wanted. Not the
    job's current Workload: a slice that replaced the first, once preempted and its quota released, holds none
    either, and it is what Kueue requeues (its name is the only one the job may be admitted under again)."""
    current = view.of(observed).workload
    for w in own(observed):
        if current is not None and w.key == current.key:
            continue
        if not w.finished and not w.quota_reserved and not w.deleting and w.replaces:
            plan.act(DeleteObject(workloads.API_VERSION, "Workload", workloads.WORKLOADS, w.name, w.uid,
                                  resource_version=w.resource_version))
