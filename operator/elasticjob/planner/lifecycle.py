"""From a job and what was observed, the next status and the actions that get there. Pure.

Level-based: every call recomputes from the whole observed state, whatever woke the operator, and every
action is idempotent (deterministic names; the controller treats 'already exists' / 'already gone' as done).
The phase is derived here and nowhere else.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob import builders, naming, torchrun
from elasticjob.domain import JobRef, Settings
from elasticjob.gang import podgroup
from elasticjob.gang.planning import ensure_gang
from elasticjob.kueue import admission
from elasticjob.models import CleanPodPolicy, ElasticJobStatus, Phase
from elasticjob.observe import PodView
from elasticjob.planner import ownership
from elasticjob.planner.base import (
    CreateObject,
    DefaultReplicas,
    DeleteJob,
    DeletePod,
    DeleteService,
    Event,
    Job,
    Observed,
    Plan,
    condition,
    enter_phase,
    set_condition,
    since,
    stamp,
)
from elasticjob.planner.failures import account_failures, account_round_failures
from elasticjob.planner.leftovers import collect_leftovers
from elasticjob.planner.recovery import drive_rendezvous, show_warm_starts
from elasticjob.planner.rendezvous import ensure_rendezvous, report_round
from elasticjob.planner.scaling import force_delete_stuck, scale, stop_all

# Phase stays Restarting at most this long while replacements start.
RESTARTING_WINDOW = timedelta(seconds=60)


def plan(job: Job, observed: Observed, now: datetime, settings: Settings | None = None, token: str = "") -> Plan:
    status = job.status.model_copy(deep=True)
    status.observed_generation = job.generation
    status.selector = naming.worker_selector(job.ref.name)
    status.desired_replicas = job.ref.spec.desired_replicas
    status.rendezvous.run_id = job.ref.uid
    ownership.begin(status)
    ownership.record_seen(status, observed.pods)
    result = Plan(status=status)
    ownership.rename_taken(result, job.ref.name, observed.squatted)
    count_workers(result, observed.workers)
    report_round(result, observed)
    collect_leftovers(result, job, observed, now)
    settings = settings or Settings()
    if not status.phase.finished:
        drive(result, job, observed, settings, token, now)
    if status.phase.finished:
        finish(result, job, observed, now)
        admission.finish(result, job, observed, settings, now)
    return result


def drive(plan: Plan, job: Job, observed: Observed, settings: Settings, token: str, now: datetime) -> None:
    spec = job.ref.spec
    problems = validate(job.ref)
    if problems:
        enter_phase(plan, job, Phase.FAILED, "InvalidSpec", "; ".join(problems), now)
        return
    if spec.replicas is None:
        plan.act(DefaultReplicas(spec.max_replicas))
    admitted = admission.gate(plan, job, observed, settings, now)
    if admitted is None:
        return  # queued in Kueue, or being suspended or resumed for it
    if spec.run_policy.suspend:
        suspend(plan, job, observed, now)
        return
    if plan.status.start_time is None:
        plan.status.start_time = stamp(now)
    if deadline_passed(plan, job, now):
        return
    force_delete_stuck(plan, observed, now)
    show_warm_starts(plan, job, settings.kit_image, now)
    store_placement = podgroup.store_placement(job.ref).merge(admitted.store)
    ensure_rendezvous(plan, job, observed, settings, token, now, store_placement)
    training_done = any(p.exited_ok for p in observed.workers)
    account_failures(plan, job, observed, training_done, now)
    if not training_done and not plan.status.phase.finished:
        account_round_failures(plan, job, observed, now)
        if settings.nudges:
            drive_rendezvous(plan, job, observed, now)
    if plan.status.phase.finished:
        plan.actions = [a for a in plan.actions if not isinstance(a, CreateObject)]
        return
    if training_done:
        complete(plan, job, observed.workers, now)
        return
    desired = spec.desired_replicas if admitted.workers is None else min(spec.desired_replicas, admitted.workers)
    plan.status.desired_replicas = desired
    placement = podgroup.worker_placement(job.ref).merge(admitted.worker)
    scale(plan, job, observed, desired, placement, create=ensure_gang(plan, job, observed), token=token,
          kit_image=settings.kit_image)
    derive_running_phase(plan, job, observed.workers, now, observed.store_pod)
    show_refusal(plan, job, observed, now)


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


def count_workers(plan: Plan, workers: list[PodView]) -> None:
    """READY: worker pods whose containers run and are ready in the kubelet's own words, not the pod's Ready
    condition, which the node lifecycle controller sets False on pods whose containers run on (observe.py)."""
    live = [p for p in workers if p.active]
    plan.status.replicas = len(live)
    plan.status.ready_replicas = sum(1 for p in live if p.containers_ready)


def runs(pod: PodView) -> bool:
    """Its main container runs (the pod Running, not leaving, its agent not exited), ready or not."""
    return pod.active and pod.phase == "Running" and pod.exit_code is None


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


def complete(plan: Plan, job: Job, workers: list[PodView], now: datetime) -> None:
    """A worker exited 0: training finished. Succeed once no worker that ever ran still runs; a pod that
    never started (no capacity, a cordoned node) holds no part of the training and is removed."""
    for pod in workers:
        if pod.never_ran:
            plan.act(DeletePod(pod.name, pod.uid, event=Event(
                "Normal", "RemovedUnstarted", f"training finished before pod {pod.name} started; removed it")))
    running = [p for p in workers if p.active and not p.never_ran]
    if running:
        names = ", ".join(p.name for p in running)
        enter_phase(plan, job, Phase.RUNNING, "Completing", f"training finished; waiting for {names} to exit", now)
        plan.soon(2)
        return
    done = sum(1 for p in workers if p.phase == "Succeeded")
    enter_phase(plan, job, Phase.SUCCEEDED, "Succeeded", f"{done} worker pod(s) completed with exit code 0", now)


def derive_running_phase(plan: Plan, job: Job, workers: list[PodView], now: datetime,
                         store: PodView | None = None) -> None:
    status, spec = plan.status, job.ref.spec
    live = [p for p in workers if p.active]
    running = [p for p in live if runs(p)]
    ready = status.ready_replicas
    desired = status.desired_replicas
    pending = [p for p in live if p.unschedulable]
    detail = f"{ready}/{desired} workers ready (min {spec.min_replicas}, max {spec.max_replicas})"
    if desired < spec.desired_replicas:
        asked = status.admission
        if asked is not None and asked.requested:
            detail += f"; {asked.message}"
        else:
            detail += (f"; replicas {spec.desired_replicas} exceeds the {desired} workers Kueue admitted: the "
                       f"rest start when the job is admitted again")
    if pending:
        detail += f"; {len(pending)} unschedulable: {pending[0].unschedulable}"
    stuck = [p for p in live if p.cannot_start]
    if stuck:
        detail += f"; {len(stuck)} cannot start: pod {stuck[0].name}, {stuck[0].cannot_start}"
    recent = since(status.last_restart_time, now)
    if recent is not None and recent < RESTARTING_WINDOW and ready < desired:
        plan.soon((RESTARTING_WINDOW - recent).total_seconds())
        enter_phase(plan, job, Phase.RESTARTING, "Restarting",
                    f"replacing failed workers (restart {status.restarts} of {spec.max_restarts}); {detail}", now)
    elif ready >= spec.min_replicas and status.rendezvous.ready:
        enter_phase(plan, job, Phase.RUNNING, "Running", detail, now)
    elif store_coming_back(plan, now) and len(running) >= spec.min_replicas:
        # Its agents ride the store's loss out (elasticjob_warm/outage.py): the workers train on meanwhile, ready
        # or not (a readiness probe of the template's own may ask the store too).
        plan.soon(5)
        back = "is back" if status.rendezvous.ready else "is coming back"
        enter_phase(plan, job, Phase.RUNNING, "StoreComingBack", f"the rendezvous store {back} at "
                    f"{status.rendezvous.endpoint}; the workers train on and rejoin it; {len(running)} running, "
                    f"{detail}", now)
    else:
        waiting = "the rendezvous store" if not status.rendezvous.ready else \
            f"at least {spec.min_replicas} ready worker{'s' if spec.min_replicas != 1 else ''}"
        if not status.rendezvous.ready and store is not None and store.cannot_start:
            waiting += f" (pod {store.name} cannot start: {store.cannot_start})"
        enter_phase(plan, job, Phase.PENDING, "Waiting", f"waiting for {waiting}; {detail}", now)
        plan.soon(5)


def store_coming_back(plan: Plan, now: datetime) -> bool:
    """The job was Running and its store is not serving; or it serves again and the workers' readiness has not
    caught up yet (for at most RESTARTING_WINDOW: a worker never ready again is waited for, Pending)."""
    status = plan.status
    if status.phase != Phase.RUNNING:
        return False
    if not status.rendezvous.ready:
        return True
    served = condition(status, "RendezvousReady")
    age = since(served.last_transition_time if served else None, now)
    return status.reason == "StoreComingBack" and age is not None and age < RESTARTING_WINDOW


def show_refusal(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    """A refusal (Pod Security, a quota, RBAC, a webhook) stays on the job until a create succeeds; until
    the retry time nothing is created."""
    status = plan.status
    if observed.refused is None:
        if any(c.type == "ReplicaFailure" and c.status == "True" for c in status.conditions):
            set_condition(status, "ReplicaFailure", False, "Created", "", now, job.generation)
        return
    set_condition(status, "ReplicaFailure", True, "FailedCreate", observed.refused, now, job.generation)
    status.message = f"{status.message}; the API server refused to create pods: {observed.refused}"
    if observed.retry_at is not None and now < observed.retry_at:
        plan.actions = [a for a in plan.actions if not isinstance(a, CreateObject)]
        plan.soon((observed.retry_at - now).total_seconds())


def suspend(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    stop_all(plan, observed)
    plan.status.start_time = None
    enter_phase(plan, job, Phase.SUSPENDED, "Suspended", "runPolicy.suspend is true: all pods stopped", now)


def finish(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    policy = job.ref.spec.run_policy
    if policy.clean_pod_policy != CleanPodPolicy.NONE:
        for pod in observed.pods:
            stop = policy.clean_pod_policy == CleanPodPolicy.ALL or pod.active or pod.role == naming.ROLE_RENDEZVOUS
            if stop and not pod.deleting:
                plan.act(DeletePod(pod.name, pod.uid))
        if observed.service is not None:
            plan.act(DeleteService(observed.service.name, observed.service.uid))
    plan.status.rendezvous.ready = False
    ttl = policy.ttl_seconds_after_finished
    elapsed = since(plan.status.completion_time, now)
    if ttl is not None and elapsed is not None:
        if elapsed >= timedelta(seconds=ttl):
            plan.act(DeleteJob())
        else:
            plan.soon((timedelta(seconds=ttl) - elapsed).total_seconds())
