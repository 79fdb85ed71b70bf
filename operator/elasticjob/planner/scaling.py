"""How many worker pods, which ones to start or stop, and pods that no kubelet will ever remove. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob import builders, naming
from elasticjob.domain import NO_PLACEMENT, Placement
from elasticjob.observe import PodView
from elasticjob.planner import ownership, planned_stop
from elasticjob.planner.base import CreateObject, DeletePod, Event, Job, Observed, Plan

# A pod still present this long after its deletion deadline, on a node that is gone or not Ready, has no
# kubelet left to remove it. On a Ready node its kubelet is still at work (or a finalizer holds it).
FORCE_DELETE_AFTER = timedelta(seconds=15)


def scale(plan: Plan, job: Job, observed: Observed, desired: int, now: datetime, placement: Placement = NO_PLACEMENT,
          create: bool = True, token: str = "", kit_image: str | None = None,
          pull_secrets: tuple[str, ...] = (), surplus: list[PodView] | None = None) -> None:
    """Exactly `desired` worker pods: the highest indexes go first, then `surplus` (pods in the training beyond
    its size, spares.py), once a training that listens saved at an agreed step (planned_stop.py); gaps are filled
    (unless `create` is False: their gang is not ready yet)."""
    workers = observed.workers
    existing = {p.index for p in workers}
    names = {i: ownership.pod_name(naming.worker_pod_name(job.ref.name, i), job.ref.uid, observed.taken, plan.status)
             for i in range(desired) if i not in existing}
    for name in names.values():
        # Recorded now, with the status written before the pods exist (a new job's first write).
        ownership.allocate(plan.status, name, token)
    leaving = [p for p in observed.by_state.active if p.index is not None and p.index >= desired]
    leaving += [p for p in surplus or [] if p not in leaving]
    if leaving and planned_stop.hold(plan, job, observed, "ScaleDown", now):
        leaving = []  # the training saves at an agreed step first (planned_stop.py)
    for pod in leaving:
        plan.act(DeletePod(pod.name, pod.uid, event=Event(
            "Normal", "ScaledDown", f"stopping pod {pod.name} gracefully: replicas is "
            f"{plan.status.desired_replicas}" + (f", spares {plan.status.desired_spares}"
                                                   if plan.status.desired_spares else ""))))
    service = observed.service
    if service is None or not service.cluster_ip or not create:
        plan.soon(1)
        return
    endpoint = plan.status.rendezvous.endpoint  # set from this Service's ClusterIP by ensure_rendezvous
    if endpoint is None:
        plan.soon(1)
        return
    for index, name in names.items():
        manifest = builders.worker_pod(job.ref, index, endpoint, plan.status.restarts, placement, kit_image,
                                       pull_secrets)
        manifest["metadata"]["name"] = name
        plan.act(CreateObject(ownership.sign(manifest, plan.status, token),
                              Event("Normal", "CreatedWorker", f"created worker pod {name}")))


def stop_all(plan: Plan, observed: Observed) -> None:
    """Delete every pod of the job (suspension, Kueue's eviction): on purpose, so no failure. The store goes
    too, and is not counted as lost, but last: each worker's agent asks it on SIGTERM whether the ranks already
    saved a planned stop (elasticjob_warm/evicted.py), and with the store going at the same time two of three
    agents waited out their 3 s connect timeout (Kueue's preemption released the quota 6 s after the save)."""
    workers = [pod for pod in observed.pods if pod.role != naming.ROLE_RENDEZVOUS]
    for pod in workers or observed.pods:
        if not pod.deleting:
            plan.act(DeletePod(pod.name, pod.uid))
    plan.status.rendezvous.ready = False


def force_delete_stuck(plan: Plan, observed: Observed, now: datetime) -> None:
    for pod in observed.pods:
        if not pod.deleting or pod.deletion_time is None or pod.deletion_grace == 0:
            continue  # not leaving, or already forced (what holds it now is a finalizer)
        overdue = now - pod.deletion_time
        if overdue < FORCE_DELETE_AFTER:
            plan.soon((FORCE_DELETE_AFTER - overdue).total_seconds())
            continue
        why = no_kubelet(pod, observed)
        if why is None:
            plan.soon(30)  # its kubelet is alive: it removes the pod, or a finalizer holds it on purpose
            continue
        plan.act(DeletePod(pod.name, pod.uid, grace_seconds=0, event=Event(
            "Warning", "ForceDeleted", f"pod {pod.name} stayed terminating {int(overdue.total_seconds())}s past "
            f"its deadline and {why}: no kubelet can confirm it stopped; removed it")))


def no_kubelet(pod: PodView, observed: Observed) -> str | None:
    """Why no kubelet can finish this pod, or None when one can."""
    if pod.node is None:
        return "it was never scheduled"
    if pod.node not in observed.nodes:
        return None  # not looked up yet: the next reconcile asks
    ready = observed.nodes[pod.node]
    if ready is None:
        return f"its node {pod.node} no longer exists"
    return None if ready else f"its node {pod.node} is not Ready"


def stuck_nodes(pods: list[PodView], now: datetime) -> set[str]:
    """The nodes to look up before planning: those of pods overdue in terminating."""
    return {p.node for p in pods if p.deleting and p.deletion_time is not None and p.node
            and now - p.deletion_time >= FORCE_DELETE_AFTER}
