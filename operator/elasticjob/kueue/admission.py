"""Admission by Kueue: a job labelled kueue.x-k8s.io/queue-name runs only while its Workload is admitted. Pure.

As Kueue's own job integrations (jobframework) do it, with runPolicy.suspend as the gate:
- no Workload yet: suspend the job (before anything is created), then create the Workload once no pod is left;
- admitted: unsuspend; pods start with the admitted count (at most) and the flavors' node labels;
- evicted or preempted (Kueue keeps the admission): suspend, stop every pod, and once they are gone release the
  quota (Requeued, QuotaReserved=False, status.admission cleared); Kueue admits it again later and training
  resumes from its checkpoint. Pods stopped this way are no failures: none is counted or charged;
- not admitted but running (someone unsuspended it): suspend again;
- finished: mark the Workload Finished, so Kueue frees its quota.
A job whose Workload exists keeps its gate when its label is removed (the Workload still holds the quota).
A pending Workload follows the spec's counts and template; once it holds quota its pod sets are immutable, so
replicas above the admitted count wait until the job is queued again, and a job whose spec.template changed since
is requeued as Kueue's jobframework requeues a job that no longer matches its Workload: suspended, every pod
stopped, the Workload deleted and a new one made with the new template. No pod of a template Kueue has not charged
is made (the chart's policy refuses the change itself while the job runs).
A job without the label, where the operator requires one (--require-queue-name), holds and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from elasticjob.domain import Settings
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import settings as kueue_settings
from elasticjob.kueue import slices, view, workloads
from elasticjob.kueue.actions import ApplyWorkloadStatus, PatchWorkload
from elasticjob.kueue.status import AdmissionStatus, set_admission
from elasticjob.kueue.view import KueueObserved, admission_of
from elasticjob.kueue.workloads import WorkloadView
from elasticjob.models import Phase
from elasticjob.planner import planned_stop
from elasticjob.planner.base import (
    UNGATED,
    Allowance,
    CreateObject,
    DeleteObject,
    Event,
    Job,
    Observed,
    Plan,
    SetSuspend,
    enter_phase,
    set_condition,
    stamp,
)
from elasticjob.planner.scaling import force_delete_stuck, stop_all

# Kueue took the job's quota back: its admission turns so, and the ledger books a Preemption.
TAKEN_BACK = ("Preempted", "Evicted")


@dataclass(frozen=True)
class Kueue(KueueObserved):
    """Kueue as the planner calls it (planner.base.Integration): the gate and the finish below."""

    def gate(self, plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> Allowance | None:
        return gate(plan, job, observed, settings, now)

    def ready_for_workers(self, plan: Plan, job: Job, observed: Observed) -> bool:
        return True  # Kueue's word is the gate's: once admitted, workers start

    def finish(self, plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> None:
        finish(plan, job, observed, settings, now)


def queue(job: Job, settings: Settings, observed: Observed) -> str | None:
    if not kueue_settings.of(settings).on:
        return None
    label = job.ref.label(kueue_names.QUEUE_LABEL)
    if label is not None:
        return label
    # The label was removed, but the job's Workload still holds (or asks for) quota: the gate stays, or the
    # job would run past what Kueue admitted (the chart's policy refuses the removal while the job runs).
    wl = own_workload(job, observed)
    return wl.queue_name if wl is not None and not wl.finished and not wl.deleting else None


def own_workload(job: Job, observed: Observed) -> WorkloadView | None:
    wl = view.of(observed).workload
    return wl if wl is not None and wl.owner_uid == job.ref.uid else None


def gate(plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> Allowance | None:
    """None: the job must not run now (it is queued, or being suspended or resumed); else what it may run."""
    name = queue(job, settings, observed)
    label = job.ref.label(kueue_names.QUEUE_LABEL)
    if name is None and label is not None:
        without_kueue(plan, job, observed, label, settings, now)
        return None
    if name is None and kueue_settings.of(settings).require_queue_name and own_workload(job, observed) is None:
        without_queue(plan, job, observed, now)
        return None
    if name is None:
        set_admission(plan.status, None)
        return UNGATED  # not a Kueue job: run as usual
    wl = own_workload(job, observed)
    suspended = job.ref.spec.run_policy.suspend
    record(plan, job, observed, wl)
    if wl is None:
        create_workload(plan, job, observed, name, suspended, now, settings.kit_image)
        return None
    evicted = wl.evicted
    if evicted is not None:
        state = "Preempted" if evicted.get("reason") == "Preempted" else "Evicted"
        if not suspended:
            plan.act(SetSuspend(True, Event("Normal", "Stopping", f"Kueue evicted Workload {wl.name} "
                                            f"({evicted.get('reason')}): stopping every pod")))
            return None
        if planned_stop.hold(plan, job, observed, state, now):
            enter_phase(plan, job, Phase.RUNNING, "Stopping", f"Kueue evicted Workload {wl.name} "
                        f"({evicted.get('reason')}): the training saves at a step all ranks agree on, then every "
                        f"pod stops", now)
            return None
        stop(plan, observed, now)
        planned_stop.forget_once_gone(plan, observed)
        slices.drop_pending(plan, observed)
        if wl.quota_reserved and not observed.pods:
            plan.act(ApplyWorkloadStatus(wl.name, workloads.release_quota(wl, now), Event(
                "Normal", "QuotaReleased", f"every pod stopped: released the quota of Workload {wl.name}")))
        elif wl.replaces and not wl.quota_reserved and not observed.pods and not wl.deleting:
            # A slice is admitted whole or waits: requeued as it is, the job would wait for all its workers.
            plan.act(DeleteObject(workloads.API_VERSION, "Workload", workloads.WORKLOADS, wl.name, wl.uid, Event(
                "Normal", "Requeued", f"deleted Workload {wl.name}, a slice Kueue {state.lower()}: a new one asks "
                f"Kueue again, down to minReplicas"), resource_version=wl.resource_version))
        queued(plan, job, state, evicted.get("message") or f"evicted by Kueue ({evicted.get('reason')})", now)
        return None
    if wl.quota_reserved and workloads.template_changed(wl, job.ref):
        requeue_for_template(plan, job, observed, wl, suspended, now)
        return None
    if wl.admitted:
        return admitted(plan, job, observed, wl, suspended, now, settings)
    if not suspended:
        plan.act(SetSuspend(True, Event("Normal", "Stopping", f"Workload {wl.name} is not admitted: suspending "
                                        f"the job until Kueue admits it")))
        return None
    stop(plan, observed, now)
    if not wl.quota_reserved and not wl.deleting and not workloads.pod_sets_match(wl, job.ref, name):
        plan.act(PatchWorkload(wl.name, wl.resource_version, workloads.pod_sets(job.ref), name))
    reserved = wl.condition("QuotaReserved") or {}
    queued(plan, job, "Queued", reserved.get("message") or f"waiting for Kueue to admit Workload {wl.name} "
           f"(LocalQueue {name})", now)
    return None


def without_kueue(plan: Plan, job: Job, observed: Observed, label: str, settings: Settings,
                  now: datetime) -> None:
    """The label asks for a quota nobody enforces: the job holds (none of its pods runs) and says why, rather
    than run outside the quota in silence."""
    if kueue_settings.of(settings).mode == "off":
        reason, why = "KueueOff", "the operator runs with Kueue off (chart value kueue.mode: off, --kueue off)"
        todo = "turn Kueue on (kueue.mode: auto)"
    else:
        reason, why = "KueueAbsent", "Kueue's API (kueue.x-k8s.io Workloads) is not served on this cluster"
        todo = "install Kueue (the operator notices it within a minute)"
    message = (f"labelled {kueue_names.QUEUE_LABEL}={label} but {why}: not started; {todo}, or remove the label "
               f"to run without a quota")
    if job.ref.spec.run_policy.suspend:
        message += " and set spec.runPolicy.suspend to false"
    stop(plan, observed, now)
    set_admission(plan.status, None)
    plan.status.start_time = None
    set_condition(plan.status, "Admitted", False, reason, message, now, job.generation)
    enter_phase(plan, job, Phase.QUEUED, reason, message, now, warn=True)
    plan.soon(60)
    return None


def without_queue(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    """This installation requires every job to be queued (Kueue's manageJobsWithoutQueueName): one without the
    label is held, never run outside a quota."""
    message = (f"this installation requires every job to name a Kueue LocalQueue (--require-queue-name): not "
               f"started; label it {kueue_names.QUEUE_LABEL}=<LocalQueue>")
    stop(plan, observed, now)
    set_admission(plan.status, None)
    plan.status.start_time = None
    set_condition(plan.status, "Admitted", False, "QueueNameRequired", message, now, job.generation)
    enter_phase(plan, job, Phase.QUEUED, "QueueNameRequired", message, now, warn=True)


def requeue_for_template(plan: Plan, job: Job, observed: Observed, wl: WorkloadView, suspended: bool,
                         now: datetime) -> None:
    """spec.template changed after Kueue reserved quota for the old one: no pod of the new one runs on that
    quota. Suspended first, then every pod stopped, then the Workload deleted (the next pass makes one with the
    new template, which Kueue admits as it admits any). Without the label the Workload is kept: it is all that
    keeps the job queued."""
    message = (f"spec.template changed after Kueue admitted Workload {wl.name}, which charges the template it was "
               f"admitted with: ")
    if not suspended:
        plan.act(SetSuspend(True, Event("Warning", "TemplateChanged", message + "suspending the job to requeue it "
                                        "with the new template")))
        return None
    stop(plan, observed, now)
    slices.drop_pending(plan, observed)
    if job.ref.label(kueue_names.QUEUE_LABEL) is None:
        queued(plan, job, "TemplateChanged", message + f"restore the template or the label {kueue_names.QUEUE_LABEL}",
               now)
        return None
    if not observed.pods and not wl.deleting:
        plan.act(DeleteObject(workloads.API_VERSION, "Workload", workloads.WORKLOADS, wl.name, wl.uid, Event(
            "Normal", "RequeuedForTemplate", f"deleted Workload {wl.name}: a new one asks Kueue for the new "
                                             f"template"), resource_version=wl.resource_version))
    queued(plan, job, "TemplateChanged", message + "requeued with the new template (a new Workload)", now)
    return None


def create_workload(plan: Plan, job: Job, observed: Observed, name: str, suspended: bool,
                    now: datetime, kit_image: str | None = None) -> None:
    """Suspended first (nothing is created before), then the Workload once no pod of the job is left."""
    if not suspended:
        plan.act(SetSuspend(True, Event("Normal", "Suspended", f"queued in LocalQueue {name}: suspended until "
                                        f"Kueue admits its Workload")))
        return None
    stop(plan, observed, now)
    workload = first_workload_name(job, observed)
    priority = view.of(observed).priority
    problem = priority.problem if priority else None
    if problem:
        queued(plan, job, "InvalidPriority", f"cannot create Workload {workload}: {problem}", now)
        plan.soon(30)
        return None
    if not observed.pods:
        plan.act(CreateObject(workloads.workload(job.ref, name, priority, kit_image, workload), Event(
            "Normal", "CreatedWorkload", f"created Workload {workload} in LocalQueue {name}"),
            plural=workloads.WORKLOADS))
    queued(plan, job, "Queued", f"waiting for Kueue to admit Workload {workload} (LocalQueue {name})", now)
    return None


def admitted(plan: Plan, job: Job, observed: Observed, wl: WorkloadView, suspended: bool,
             now: datetime, settings: Settings) -> Allowance | None:
    flavors = view.of(observed).flavors
    missing = workloads.missing_flavors(wl, flavors)
    if missing:  # its node labels are what the pods need: wait for the flavors' watch
        queued(plan, job, "Queued", f"admitted, waiting to see ResourceFlavor {', '.join(missing)}", now)
        plan.soon(2)
        return None
    asked = (wl.pod_set(kueue_names.PODSET_WORKERS) or (job.ref.spec.desired_pods, None))[0]
    granted = (wl.assignment(kueue_names.PODSET_WORKERS) or workloads.Assignment("", None)).count
    # Kueue counts the lesser: a slice shrunk in place keeps its admission's count (pkg/workload usage).
    workers = asked if granted is None else min(granted, asked)
    if suspended:
        names = ", ".join(sorted({f for a in wl.assignments for _, f in a.flavors})) or "no flavor"
        plan.act(SetSuspend(False, Event("Normal", "Admitted", f"admitted by ClusterQueue {wl.cluster_queue}: "
                                         f"{workers} workers ({names}); starting")))
        return None
    status = admission_of(plan)
    status.cluster_queue = wl.cluster_queue
    status.flavors = dict((wl.assignment(kueue_names.PODSET_WORKERS) or workloads.Assignment("", None)).flavors) or None
    transition(plan, "Admitted", f"admitted by ClusterQueue {wl.cluster_queue}", now)
    if kueue_settings.of(settings).slices:
        workers = slices.resize(plan, job, observed, wl, workers, now, settings.kit_image)
    status.workers = workers
    set_condition(plan.status, "Admitted", True, "Admitted", status.message or "", now, job.generation)
    return Allowance(workers=workers, worker=workloads.placement(wl, kueue_names.PODSET_WORKERS, flavors),
                     store=workloads.placement(wl, kueue_names.PODSET_STORE, flavors), note=capped(job, status))


def capped(job: Job, status: AdmissionStatus) -> str:
    """Why the job runs fewer workers than its replicas, where it does: a slice asked for, or none."""
    if status.requested and status.message:
        return status.message
    return (f"replicas {job.ref.spec.desired_replicas} exceeds the {status.workers} workers Kueue admitted: the "
            f"rest start when the job is admitted again")


def first_workload_name(job: Job, observed: Observed) -> str:
    """The name of a Workload that starts the job's admission over: the job's usual one, or, where a Workload of
    that name is left (Finished, replaced by a slice that was preempted since), the next slice's name."""
    usual = kueue_names.workload_name(job.ref.name, job.ref.uid)
    return usual if all(w.name != usual for w in slices.own(observed)) else slices.next_slice_name(job, observed)


def record(plan: Plan, job: Job, observed: Observed, wl: WorkloadView | None) -> None:
    status = admission_of(plan)
    status.workload = wl.name if wl is not None else first_workload_name(job, observed)
    status.template_hash = wl.template_hash if wl is not None else workloads.template_hash(job.ref.spec)


def transition(plan: Plan, state: str, message: str, now: datetime) -> None:
    status = admission_of(plan)
    if status.state != state:
        status.last_transition_time = stamp(now)
        if state in TAKEN_BACK:
            plan.preempted = state  # the ledger opens a Preemption incident
    status.state, status.message = state, message


def stop(plan: Plan, observed: Observed, now: datetime) -> None:
    """Every pod goes: they were stopped on purpose, so none is counted as a failure."""
    stop_all(plan, observed)
    force_delete_stuck(plan, observed, now)
    if observed.pods:
        plan.soon(2)


def queued(plan: Plan, job: Job, reason: str, message: str, now: datetime) -> None:
    state = reason if reason in TAKEN_BACK else "Queued"
    admission = admission_of(plan)
    transition(plan, state, message, now)
    admission.cluster_queue = admission.workers = admission.flavors = admission.requested = None
    plan.status.start_time = None  # a deadline counts from the last start
    set_condition(plan.status, "Admitted", False, reason, message, now, job.generation)
    enter_phase(plan, job, Phase.QUEUED, reason, message, now)


def finish(plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> None:
    """The job ended: the Workload is Finished (jobframework step 3), so Kueue frees its quota."""
    if queue(job, settings, observed) is None:
        return
    wl = own_workload(job, observed)
    if wl is None or wl.deleting:
        return
    slices.drop_pending(plan, observed)
    if not wl.finished:
        succeeded = plan.status.phase == Phase.SUCCEEDED
        plan.act(ApplyWorkloadStatus(wl.name, workloads.finish(wl, succeeded, plan.status.message or "", now), Event(
            "Normal", "FinishedWorkload", f"Workload {wl.name} is declared finished")))
    record(plan, job, observed, wl)
    transition(plan, "Finished", f"the job {plan.status.phase.value.lower()}", now)
