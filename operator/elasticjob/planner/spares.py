"""Warm spares (spec.spares): how many pods the job runs, which of them are spares now, and the store's seats.
Pure.

A job with spares runs desiredReplicas + desiredSpares worker pods, all alike. Which are spares is decided by the
store at run time (elasticjob_store/seats.py): it hands out desiredReplicas seats, and an agent joins a round only
with one (elasticjob_warm/seat.py). So the operator never picks a spare: it keeps the pod count, tells the store the
seats' count, and reads back who waits. A lost worker's seat goes to the spare that asked first, within the
store's tick, and the lost pod's replacement becomes the next spare.
"""

from __future__ import annotations

from elasticjob.observe import PodView
from elasticjob.planner.base import ControlAddress, Event, Job, Observed, Plan, StoreAction
from elasticjob_store.protocol import Seats


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
    staying = sorted((p for p in observed.workers if p.active and p.index is not None and p.index < total
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
    return [p for p in observed.workers if p.active and p.ip in spare_ips(observed)]
