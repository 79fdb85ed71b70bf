"""The phase a running job shows, derived from its pods and its store, and nowhere else. Pure.

Counts (READY is containers ready, in the kubelet's words), the running phases (Running, Restarting,
StoreComingBack, Pending with what it waits for), success once a worker exited 0, and a refusal kept on the job
until a create succeeds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.models import Phase
from elasticjob.observe import PodView, WorkerPods
from elasticjob.planner import nodes
from elasticjob.planner.base import (
    CreateObject,
    DeletePod,
    Event,
    Job,
    Observed,
    Plan,
    condition,
    enter_phase,
    set_condition,
    since,
)

# Phase stays Restarting at most this long while replacements start.
RESTARTING_WINDOW = timedelta(seconds=60)


def count_workers(plan: Plan, workers: WorkerPods, spares: frozenset[str] = frozenset()) -> None:
    """READY: worker pods whose containers run and are ready in the kubelet's own words, not the pod's Ready
    condition, which the node lifecycle controller sets False on pods whose containers run on (observe.py), and
    whose agent the operator did not take out of the rendezvous (a pod left running, cut off or frozen, trains
    nothing). Through the kit a worker container is ready only while its agent hears from the store. The warm
    spares (`spares`: their addresses, as the store reports them) are counted apart, in SPARES."""
    live = [p for p in workers.active if p.ip not in spares]
    left_out = set(plan.status.rendezvous.left_out)
    plan.status.replicas = len(live)
    plan.status.ready_replicas = sum(1 for p in live if p.containers_ready and p.uid not in left_out)
    plan.status.spares = sum(1 for p in workers.active if p.ip in spares and p.containers_ready)


def complete(plan: Plan, job: Job, workers: WorkerPods, now: datetime, spares: list[PodView] | None = None) -> None:
    """A worker exited 0: training finished. Succeed once no worker that ever ran still runs; a pod that
    never started (no capacity, a cordoned node) holds no part of the training and is removed, and so is a warm
    spare (`spares`), which trained nothing and would wait for a seat for ever."""
    for pod in workers.never_ran:
        plan.act(DeletePod(pod.name, pod.uid, event=Event(
            "Normal", "RemovedUnstarted", f"training finished before pod {pod.name} started; removed it")))
    for pod in spares or []:
        if not pod.never_ran:
            plan.act(DeletePod(pod.name, pod.uid, event=Event(
                "Normal", "RemovedSpare", f"training finished; removed warm spare {pod.name}")))
    running = [p for p in workers.active if not p.never_ran]
    if running:
        names = ", ".join(p.name for p in running)
        enter_phase(plan, job, Phase.RUNNING, "Completing", f"training finished; waiting for {names} to exit", now)
        plan.soon(2)
        return
    done = sum(1 for p in workers.all if p.phase == "Succeeded")
    enter_phase(plan, job, Phase.SUCCEEDED, "Succeeded", f"{done} worker pod(s) completed with exit code 0", now)


def derive_running_phase(plan: Plan, job: Job, workers: WorkerPods, now: datetime,
                         store: PodView | None = None, capped: str = "") -> None:
    """`capped`: why the integrations let the job run fewer workers than its replicas, in their words."""
    status, spec = plan.status, job.ref.spec
    live, running = workers.active, workers.running
    ready = status.ready_replicas
    desired = status.desired_replicas
    pending = [p for p in live if p.unschedulable]
    detail = f"{ready}/{desired} workers ready (min {spec.min_replicas}, max {spec.max_replicas})"
    if desired < spec.desired_replicas and capped:
        detail += f"; {capped}"  # the integration's words (Allowance.note)
    if pending:
        detail += f"; {len(pending)} unschedulable: {pending[0].unschedulable}"
        detail += nodes.why_pending(status, pending)
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
    """The job was training (Running, or Restarting: its survivors train on) and its store is not serving; or it
    serves again and the workers' readiness has not caught up yet (for at most RESTARTING_WINDOW: a worker never
    ready again is waited for, Pending). A job that trains is never Pending."""
    status = plan.status
    if status.phase not in (Phase.RUNNING, Phase.RESTARTING):
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


