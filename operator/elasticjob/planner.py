"""Decisions: from a job and what was observed, the next status and the actions that get there. Pure.

Level-based: every call recomputes from the whole observed state, whatever woke the operator, and every
action is idempotent (deterministic names; the handlers treat 'already exists' / 'already gone' as done).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Union

from elasticjob import builders, naming, torchrun
from elasticjob.builders import JobRef
from elasticjob.models import (
    MAX_FAILURES_KEPT,
    CleanPodPolicy,
    Condition,
    ElasticJobStatus,
    FailureRecord,
    Phase,
)
from elasticjob.observe import PodView, RendezvousView, ServiceView

# Failures this close together are one incident: agents of one group tend to fail together.
INCIDENT_WINDOW = timedelta(seconds=15)
# A pod still present this long after its deletion deadline has no kubelet left to remove it.
FORCE_DELETE_AFTER = timedelta(seconds=15)
# Phase stays Restarting at most this long while replacements start.
RESTARTING_WINDOW = timedelta(seconds=60)
RESYNC_SECONDS = 30.0

INFRASTRUCTURE_REASONS = ("Evicted", "Preempted", "NodeLost")


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class CreateObject:
    manifest: dict
    event: Event | None = None  # posted only when the object was really created


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str
    grace_seconds: int | None = None
    event: Event | None = None  # posted only when the pod was really there


@dataclass(frozen=True)
class DeleteService:
    name: str


@dataclass(frozen=True)
class DefaultReplicas:
    replicas: int


@dataclass(frozen=True)
class DeleteJob:
    pass


Action = Union[CreateObject, DeletePod, DeleteService, DefaultReplicas, DeleteJob]


@dataclass(frozen=True)
class Job:
    ref: JobRef
    generation: int
    status: ElasticJobStatus


@dataclass
class Plan:
    status: ElasticJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float = RESYNC_SECONDS

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def normal(self, reason: str, message: str) -> None:
        self.events.append(Event("Normal", reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.events.append(Event("Warning", reason, message))

    def soon(self, seconds: float) -> None:
        self.requeue_after = max(1.0, min(self.requeue_after, seconds))


def stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def since(value: str | None, now: datetime) -> timedelta | None:
    if not value:
        return None
    return now - datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- validation -------------------------------------------------------------------------------------------


def reject(job: Job, status: ElasticJobStatus, message: str, now: datetime) -> Plan:
    """The API server refused an object built from the spec: the spec is invalid."""
    result = Plan(status=status.model_copy(deep=True))
    enter_phase(result, job, Phase.FAILED, "InvalidSpec", message, now)
    return result


def validate(ref: JobRef) -> list[str]:
    """What the schema cannot check. Each message says what to fix."""
    container = builders.worker_container(ref.spec.template)
    if container is None:
        return ["template.spec.containers is empty: add the worker container that runs torchrun"]
    name = container.get("name", "?")
    problems = []
    if not container.get("image"):
        problems.append(f"container {name!r} has no image")
    if not container.get("command") and not container.get("args"):
        problems.append(f"container {name!r} has no command: set command: [torchrun, train.py, ...]")
    reserved = sorted({e.get("name") for e in container.get("env") or []} & torchrun.RESERVED_ENV)
    if reserved:
        problems.append(f"container {name!r} sets {', '.join(reserved)}, which the operator or torchrun "
                        f"sets itself: remove them")
    gpus = torchrun.requested_gpus(container)
    nproc = ref.spec.nproc_per_node
    if isinstance(nproc, int) and gpus and nproc > gpus:
        problems.append(f"nprocPerNode {nproc} exceeds the {gpus} GPUs container {name!r} requests: "
                        f"use nprocPerNode: auto or request more GPUs")
    return problems


# --- conditions and phase ---------------------------------------------------------------------------------


def set_condition(status: ElasticJobStatus, kind: str, value: bool, reason: str, message: str,
                  now: datetime, generation: int) -> None:
    wanted = "True" if value else "False"
    for cond in status.conditions:
        if cond.type == kind:
            if cond.status != wanted:
                cond.last_transition_time = stamp(now)
            cond.status, cond.reason, cond.message, cond.observed_generation = wanted, reason, message, generation
            return
    status.conditions.append(Condition(type=kind, status=wanted, reason=reason, message=message,
                                       last_transition_time=stamp(now), observed_generation=generation))


def enter_phase(plan: Plan, job: Job, phase: Phase, reason: str, message: str, now: datetime) -> None:
    status = plan.status
    if status.phase != phase or status.reason != reason:
        event = plan.warn if phase in (Phase.FAILED, Phase.RESTARTING) else plan.normal
        event(reason, message)
    status.phase, status.reason, status.message = phase, reason, message
    if phase.finished and not status.completion_time:
        status.completion_time = stamp(now)
    for kind in ("Running", "Restarting", "Succeeded", "Failed", "Suspended"):
        active = kind == phase.value
        set_condition(status, kind, active, reason if active else f"Not{kind}", message if active else "",
                      now, job.generation)


# --- the plan ---------------------------------------------------------------------------------------------


def plan(job: Job, pods: list[PodView], service: ServiceView | None, now: datetime,
         rendezvous: RendezvousView | None = None) -> Plan:
    status = job.status.model_copy(deep=True)
    status.observed_generation = job.generation
    status.selector = naming.worker_selector(job.ref.name)
    status.desired_replicas = job.ref.spec.desired_replicas
    status.rendezvous.run_id = job.ref.uid
    result = Plan(status=status)
    workers = [p for p in pods if p.role == naming.ROLE_WORKER]
    count_workers(result, workers)
    if rendezvous is not None:
        status.rendezvous.round, status.rendezvous.nodes = rendezvous.round, rendezvous.nodes
    if not status.phase.finished:
        drive(result, job, pods, workers, service, now)
    if status.phase.finished:
        finish(result, job, pods, service, now)
    return result


def drive(plan: Plan, job: Job, pods: list[PodView], workers: list[PodView], service: ServiceView | None,
          now: datetime) -> None:
    spec = job.ref.spec
    problems = validate(job.ref)
    if problems:
        enter_phase(plan, job, Phase.FAILED, "InvalidSpec", "; ".join(problems), now)
        return
    if spec.replicas is None:
        plan.act(DefaultReplicas(spec.max_replicas))
    if spec.run_policy.suspend:
        suspend(plan, job, pods, service, now)
        return
    if plan.status.start_time is None:
        plan.status.start_time = stamp(now)
    if deadline_passed(plan, job, now):
        return
    force_delete_stuck(plan, pods, now)
    ensure_rendezvous(plan, job, pods, service, now)
    training_done = any(p.phase == "Succeeded" for p in workers)
    account_failures(plan, job, workers, training_done, now)
    if plan.status.phase.finished:
        plan.actions = [a for a in plan.actions if not isinstance(a, CreateObject)]
        return
    if training_done:
        complete(plan, job, workers, now)
        return
    scale(plan, job, workers, service)
    derive_running_phase(plan, job, workers, now)


def count_workers(plan: Plan, workers: list[PodView]) -> None:
    live = [p for p in workers if p.active]
    plan.status.replicas = len(live)
    plan.status.ready_replicas = sum(1 for p in live if p.ready)


def deadline_passed(plan: Plan, job: Job, now: datetime) -> bool:
    limit = job.ref.spec.run_policy.active_deadline_seconds
    elapsed = since(plan.status.start_time, now)
    if limit is None or elapsed is None:
        return False
    if elapsed >= timedelta(seconds=limit):
        enter_phase(plan, job, Phase.FAILED, "DeadlineExceeded",
                    f"the job ran longer than activeDeadlineSeconds={limit}", now)
        return True
    plan.soon((timedelta(seconds=limit) - elapsed).total_seconds())
    return False


def force_delete_stuck(plan: Plan, pods: list[PodView], now: datetime) -> None:
    for pod in pods:
        if not pod.deleting or pod.deletion_time is None:
            continue
        overdue = now - pod.deletion_time
        if overdue >= FORCE_DELETE_AFTER:
            plan.act(DeletePod(pod.name, pod.uid, grace_seconds=0, event=Event(
                "Warning", "ForceDeleted", f"pod {pod.name} stayed terminating {int(overdue.total_seconds())}s "
                f"past its deadline on node {pod.node} (no kubelet answering); removed it")))
        else:
            plan.soon((FORCE_DELETE_AFTER - overdue).total_seconds())


# --- failures ---------------------------------------------------------------------------------------------


def classify(pod: PodView, job: Job, status: ElasticJobStatus, now: datetime) -> tuple[str, bool]:
    """(reason, charged to the restart budget) of a worker pod that ended badly."""
    policy = job.ref.spec.failure_policy
    if pod.disruption:
        return pod.disruption, policy.count_infrastructure_failures
    if pod.store_lost or rendezvous_just_lost(pod, job, status, now):
        return "RendezvousLost", False
    if pod.worker_exit_code in policy.fatal_exit_codes:
        return "FatalExitCode", True
    if pod.agent_gave_up:
        return "MaxRestartsExceeded", True
    if pod.exit_code is not None and pod.exit_code >= 128:
        return "Killed", True
    return pod.reason or "Error", True


def rendezvous_just_lost(pod: PodView, job: Job, status: ElasticJobStatus, now: datetime) -> bool:
    """Agents exit about a second after their store goes away; failures that close to it are its doing."""
    lost = since(status.rendezvous.last_lost_time, pod.finished_at or now)
    return lost is not None and -INCIDENT_WINDOW <= lost <= INCIDENT_WINDOW


def same_incident(pod: PodView, status: ElasticJobStatus, finished: datetime) -> bool:
    """A pod that predates the last restart and failed right around it went down with that restart;
    a replacement started after it, or a failure long after it, is a new restart."""
    if pod.generation is not None and pod.generation >= status.restarts:
        return False
    last = since(status.last_restart_time, finished)
    return last is not None and abs(last) <= INCIDENT_WINDOW


def describe(pod: PodView) -> str:
    code = f"exit code {pod.worker_exit_code}" if pod.worker_exit_code is not None else "no exit code"
    where = f" on node {pod.node}" if pod.node else ""
    return f"pod {pod.name} (replica {pod.index}){where}: {code}, {pod.reason or pod.phase}"


def is_failed(pod: PodView) -> bool:
    """A pod deleted on purpose (scale-down, suspend, a user) is no failure; an evicted one is."""
    if pod.deleting:
        return pod.disruption is not None
    return pod.phase == "Failed"


def account_failures(plan: Plan, job: Job, workers: list[PodView], training_done: bool, now: datetime) -> None:
    """Record each failed pod once (by uid, before it is deleted), then delete it to make room for its
    replacement."""
    status = plan.status
    seen = {f.uid for f in status.last_failures}
    for pod in sorted((p for p in workers if is_failed(p)), key=lambda p: p.name):
        if pod.uid not in seen:
            if training_done:
                # An agent exits 0 only when its workers succeeded: training is done, a straggler's exit is not.
                record_failure(plan, job, pod, pod.reason or "Error", False, now, "training had already finished")
            else:
                reason, charged = classify(pod, job, status, now)
                record_failure(plan, job, pod, reason, charged, now)
            if status.phase.finished:
                return
        if pod.phase == "Failed" and not pod.deleting:
            plan.act(DeletePod(pod.name, pod.uid, grace_seconds=0))


def record_failure(plan: Plan, job: Job, pod: PodView, reason: str, charged: bool, now: datetime,
                   why_uncharged: str = "not charged to maxRestarts") -> None:
    status, spec = plan.status, job.ref.spec
    finished = pod.finished_at or now
    status.last_failures = (status.last_failures + [FailureRecord(
        pod=pod.name, uid=pod.uid, replica_index=pod.index, exit_code=pod.worker_exit_code, reason=reason,
        message=pod.message[-1024:], charged=charged, time=stamp(finished))])[-MAX_FAILURES_KEPT:]
    text = describe(pod)
    if reason == "FatalExitCode":
        enter_phase(plan, job, Phase.FAILED, "FatalExitCode",
                    f"{text}; {pod.worker_exit_code} is in failurePolicy.fatalExitCodes", now)
        return
    if reason == "MaxRestartsExceeded":
        status.restarts = max(status.restarts, spec.max_restarts)
        enter_phase(plan, job, Phase.FAILED, "MaxRestartsExceeded",
                    f"torchrun used up the restart budget (maxRestarts={spec.max_restarts}); last failure: {text}",
                    now)
        return
    if not charged:
        if reason in INFRASTRUCTURE_REASONS:
            status.infrastructure_failures += 1
        plan.warn(reason, f"{text}; {why_uncharged}")
        return
    if not same_incident(pod, status, finished):
        status.restarts += 1
        status.last_restart_time = stamp(finished)
    if status.restarts > spec.max_restarts:
        enter_phase(plan, job, Phase.FAILED, "MaxRestartsExceeded",
                    f"{status.restarts} restarts exceed maxRestarts={spec.max_restarts}; last failure: {text}", now)
        return
    plan.warn("WorkerFailed", f"{text}; restarting the group (restart {status.restarts} of {spec.max_restarts})")


# --- rendezvous -------------------------------------------------------------------------------------------


def ensure_rendezvous(plan: Plan, job: Job, pods: list[PodView], service: ServiceView | None,
                      now: datetime) -> None:
    rdzv = next((p for p in pods if p.role == naming.ROLE_RENDEZVOUS), None)
    status = plan.status.rendezvous
    status.pod = naming.rendezvous_name(job.ref.name)
    if service is None:
        plan.act(CreateObject(builders.rendezvous_service(job.ref), Event(
            "Normal", "RendezvousCreated", f"created Service {status.pod} for the c10d rendezvous store")))
    elif service.cluster_ip:
        status.endpoint = f"{service.cluster_ip}:{job.ref.spec.rendezvous.port}"
    if rdzv is None:
        plan.act(CreateObject(builders.rendezvous_pod(job.ref)))
    elif rdzv.phase in ("Failed", "Succeeded") and not rdzv.deleting:
        plan.act(DeletePod(rdzv.name, rdzv.uid, grace_seconds=0))
    ready = rdzv is not None and rdzv.serving
    if status.ready and not ready:
        status.restarts += 1
        status.last_lost_time = stamp(now)
        plan.warn("RendezvousLost", f"rendezvous pod {status.pod} stopped serving; bringing it back, agents "
                                    f"re-form the group at the same endpoint {status.endpoint}")
    status.ready = ready
    set_condition(plan.status, "RendezvousReady", ready, "StoreReady" if ready else "StoreNotReady",
                  f"c10d store at {status.endpoint}" if ready else "waiting for the rendezvous pod",
                  now, job.generation)


# --- scaling ----------------------------------------------------------------------------------------------


def restart_budget(plan: Plan, job: Job) -> int:
    return max(0, job.ref.spec.max_restarts - plan.status.restarts)


def scale(plan: Plan, job: Job, workers: list[PodView], service: ServiceView | None) -> None:
    desired = job.ref.spec.desired_replicas
    existing = {p.index for p in workers}
    for pod in workers:
        if pod.active and pod.index is not None and pod.index >= desired:
            plan.act(DeletePod(pod.name, pod.uid, event=Event(
                "Normal", "ScaledDown", f"stopping pod {pod.name} gracefully: replicas is {desired}")))
    if service is None or not service.cluster_ip:
        plan.soon(1)
        return
    endpoint = plan.status.rendezvous.endpoint  # set from this Service's ClusterIP by ensure_rendezvous
    missing = [i for i in range(desired) if i not in existing]
    budget = restart_budget(plan, job)
    for index in missing:
        pod = builders.worker_pod(job.ref, index, endpoint, budget, plan.status.restarts)
        plan.act(CreateObject(pod, Event(
            "Normal", "CreatedWorker", f"created worker pod {naming.worker_pod_name(job.ref.name, index)} "
            f"(torchrun restart budget {budget})")))


def complete(plan: Plan, job: Job, workers: list[PodView], now: datetime) -> None:
    """A worker exited 0: training finished. Succeed once no worker runs any more; start none."""
    running = [p for p in workers if p.active]
    if running:
        names = ", ".join(p.name for p in running)
        enter_phase(plan, job, Phase.RUNNING, "Completing", f"training finished; waiting for {names} to exit", now)
        plan.soon(2)
        return
    done = sum(1 for p in workers if p.phase == "Succeeded")
    enter_phase(plan, job, Phase.SUCCEEDED, "Succeeded", f"{done} worker pod(s) completed with exit code 0", now)


def derive_running_phase(plan: Plan, job: Job, workers: list[PodView], now: datetime) -> None:
    status, spec = plan.status, job.ref.spec
    live = [p for p in workers if p.active]
    ready = status.ready_replicas
    desired = spec.desired_replicas
    pending = [p for p in live if p.unschedulable]
    detail = f"{ready}/{desired} workers ready (min {spec.min_replicas}, max {spec.max_replicas})"
    if pending:
        detail += f"; {len(pending)} unschedulable: {pending[0].unschedulable}"
    recent = since(status.last_restart_time, now)
    if recent is not None and recent < RESTARTING_WINDOW and ready < desired:
        plan.soon((RESTARTING_WINDOW - recent).total_seconds())
        enter_phase(plan, job, Phase.RESTARTING, "Restarting",
                    f"replacing failed workers (restart {status.restarts} of {spec.max_restarts}); {detail}", now)
    elif ready >= spec.min_replicas and status.rendezvous.ready:
        enter_phase(plan, job, Phase.RUNNING, "Running", detail, now)
    else:
        waiting = "rendezvous store" if not status.rendezvous.ready else f"at least {spec.min_replicas} workers"
        enter_phase(plan, job, Phase.PENDING, "Waiting", f"waiting for the {waiting}; {detail}", now)
        plan.soon(5)


# --- suspension and the end -------------------------------------------------------------------------------


def suspend(plan: Plan, job: Job, pods: list[PodView], service: ServiceView | None, now: datetime) -> None:
    for pod in pods:
        if not pod.deleting:
            plan.act(DeletePod(pod.name, pod.uid))
    plan.status.rendezvous.ready = False
    plan.status.start_time = None
    enter_phase(plan, job, Phase.SUSPENDED, "Suspended", "runPolicy.suspend is true: all pods stopped", now)


def finish(plan: Plan, job: Job, pods: list[PodView], service: ServiceView | None, now: datetime) -> None:
    policy = job.ref.spec.run_policy
    if policy.clean_pod_policy != CleanPodPolicy.NONE:
        for pod in pods:
            stop = policy.clean_pod_policy == CleanPodPolicy.ALL or pod.active or pod.role == naming.ROLE_RENDEZVOUS
            if stop and not pod.deleting:
                plan.act(DeletePod(pod.name, pod.uid))
        if service is not None:
            plan.act(DeleteService(service.name))
    plan.status.rendezvous.ready = False
    ttl = policy.ttl_seconds_after_finished
    elapsed = since(plan.status.completion_time, now)
    if ttl is not None and elapsed is not None:
        if elapsed >= timedelta(seconds=ttl):
            plan.act(DeleteJob())
        else:
            plan.soon((timedelta(seconds=ttl) - elapsed).total_seconds())
