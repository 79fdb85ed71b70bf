"""Warm spares (spec.spares): how many pods the job runs, which of them are spares now, and the store's seats.
Pure.

A job with spares runs desiredReplicas + desiredSpares worker pods, all alike. Which are spares is decided by the
store at run time (elasticjob_store/seats.py): it hands out desiredReplicas seats, and an agent joins a round only
with one (elasticjob_warm/seat.py). So the operator never picks a spare: it keeps the pod count, tells the store the
seats' count, and reads back who waits. A lost worker's seat goes to the spare that asked first, within the
store's tick, and the lost pod's replacement becomes the next spare. A spare cut off from the network has no agent
in the rendezvous for the operator to find silent; the kubelet's word that it stopped being ready replaces it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.observe import PodView, StoreView
from elasticjob.planner import nodes
from elasticjob.planner.base import ControlAddress, DeletePod, Event, Job, Observed, Plan, StoreAction, stamp
from elasticjob_store.protocol import Seats

# How long a spare's containers stay not ready before it is taken for cut off or frozen. Through the kit its
# readiness probe fails once its agent hears nothing from the store (kit.HEALTH_PROBE: about 4 s after a cut);
# the wait beyond that spares a pod whose probe answered late twice under load (a throttled CPU) for a moment.
CUT_OFF_AFTER = timedelta(seconds=3)


def pods_wanted(plan: Plan) -> int:
    """Worker pods the job runs now: its workers and its spares."""
    return plan.status.desired_replicas + plan.status.desired_spares


def spare_ips(observed: Observed) -> frozenset[str]:
    """The addresses of the agents waiting for a seat, as the store reports them."""
    store = observed.store
    return frozenset(store.seats.spares) if store is not None and store.seats is not None else frozenset()


def joining_ips(observed: Observed) -> frozenset[str]:
    """Agents given a seat that are not in the rendezvous yet: a spare on its way into the next round."""
    store = observed.store
    return frozenset(store.seats.joining) if store is not None and store.seats is not None else frozenset()


def seated(pods: list[PodView], observed: Observed) -> list[PodView]:
    """The pods that are not spares now."""
    spares = spare_ips(observed)
    return [p for p in pods if p.ip not in spares]


def surplus_seated(plan: Plan, observed: Observed) -> list[PodView]:
    """Pods in the training beyond desiredReplicas that the highest indexes going leaves (a scale-down whose
    highest pods were spares): the highest-indexed of them go too, and their replacements come back as spares."""
    store = observed.store
    if store is None or store.seats is None:
        return []
    total = pods_wanted(plan)
    staying = sorted((p for p in observed.by_state.active if p.index is not None and p.index < total
                      and p.ip in store.seats.held), key=lambda p: p.index or 0)
    extra = len(staying) - plan.status.desired_replicas
    return staying[-extra:] if extra > 0 else []


def tell_store(plan: Plan, job: Job, observed: Observed, endpoint: ControlAddress | None) -> None:
    """The seats' count where the store holds another: the job's workers, or none without spares."""
    store = observed.store
    if store is None or endpoint is None:
        return
    wanted = plan.status.desired_replicas if plan.status.desired_spares or job.ref.spec.spares else None
    held = store.seats.count if store.seats is not None else None
    if wanted == held or wanted == 0:
        return
    said = f"{wanted} seat(s) for {plan.status.desired_spares} spare(s)" if wanted else "no seats"
    plan.act(StoreAction(Seats(wanted), endpoint, Event("Normal", "SeatsSet", f"the store hands out {said}")))


def remove_at_end(observed: Observed) -> list[PodView]:
    """The spares once the training finished: they trained nothing and would wait for ever."""
    return [p for p in observed.by_state.active if p.ip in spare_ips(observed)]


def cut_off(plan: Plan, observed: Observed, store: StoreView, now: datetime) -> list[PodView]:
    """Spares the kubelet has reported not ready for CUT_OFF_AFTER, after they had been ready: running pods with no
    seat and no agent in the store's rendezvous, in a job that runs spares (a pod whose agent the operator took out
    is recovery's). Where one is not ready for less, the operator looks again once the wait is over (nothing else
    would wake it)."""
    seats = store.seats
    if seats is None or not plan.status.desired_spares:
        return []
    taken = {n.addr for n in store.participants + store.waiting} | set(seats.held) | set(seats.joining)
    left_out = set(plan.status.rendezvous.left_out)
    found = []
    for pod in observed.workers:
        if not pod.running or pod.lost_ready_at is None or pod.ip in taken or pod.uid in left_out:
            continue
        waited = now - pod.lost_ready_at
        if waited >= CUT_OFF_AFTER:
            found.append(pod)
        else:
            plan.soon((CUT_OFF_AFTER - waited).total_seconds())
    return found


def replace_cut_off(plan: Plan, job: Job, pods: list[PodView], now: datetime) -> None:
    """Stops each cut-off spare at once (it trains nothing and can save nothing) and avoids its node, as for a
    cut-off worker; the pod count brings a new spare. Nothing is booked or charged: no training waited on it."""
    for pod in pods:
        text = (f"spare pod {pod.name} on node {pod.node} is not ready since {stamp(pod.lost_ready_at or now)}: "
                "its agent hears nothing from the store (cut off, or frozen)")
        nodes.avoid(plan, job, pod.node, nodes.PARTITIONED, text, now)
        plan.act(DeletePod(pod.name, pod.uid, grace_seconds=nodes.CUT_OFF_GRACE, event=Event(
            "Warning", "Partitioned", f"{text}; stopped, a new spare takes its place")))
