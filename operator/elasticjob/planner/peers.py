"""Which peers the job's store answers: the job's own pods, as the operator sees them. Pure.

The store's port lets through only the addresses the operator names (elasticjob_store/gate.py), so that no other
pod can write torch's state, a stop or a bomb into it, whether or not the cluster enforces NetworkPolicies. The
operator names every worker pod of the job that has an IP, from its own view of the pods (admitted and signed:
ownership.py), never from what the store reports, and again whenever the store's list differs from it (a pod
added or gone, a store that restarted with an empty list). A pod keeps its place until it is gone: a deleted
pod's agent still saves and leaves through the store. The store's refusals are shown once each (Event
StorePeerRefused), counted in status.rendezvous.refusedPeers.
"""

from __future__ import annotations

from elasticjob.observe import StoreView
from elasticjob.planner.base import Job, Observed, Plan, StoreAction
from elasticjob.planner.recovery import control_endpoint
from elasticjob_store.protocol import Peers

# The refused addresses an Event names at most.
NAMED = 4


def job_addresses(observed: Observed) -> tuple[str, ...]:
    return tuple(sorted({pod.ip for pod in observed.workers if pod.ip}))


def tell_store(plan: Plan, job: Job, observed: Observed) -> None:
    """Names the job's pods to its store when its gate holds another list; shows the peers it refused."""
    store, endpoint = observed.store, control_endpoint(observed, job)
    if store is None or store.peers is None or endpoint is None:
        return  # no store answered yet, or one without a gate (--no-store-peer-check, an older store)
    wanted = job_addresses(observed)
    if not store.peers.told or store.peers.allowed != wanted:
        plan.act(StoreAction(Peers(wanted), endpoint))
    show_refusals(plan, store)


def show_refusals(plan: Plan, store: StoreView) -> None:
    assert store.peers is not None
    status = plan.status.rendezvous
    refused, known = store.peers.refused, status.refused_peers
    if refused < known:  # a new store counts from zero
        status.refused_peers = refused
        return
    if refused == known:
        return
    status.refused_peers = refused
    names = ", ".join(store.peers.last_refused[-NAMED:]) or "unknown addresses"
    told = "" if store.peers.told else " (before the operator had named the job's pods to it)"
    plan.warn("StorePeerRefused", f"the rendezvous store refused {refused - known} connection(s) from {names}{told}: "
                                  f"it answers only this job's pods. If these are the job's own agents, the network "
                                  f"rewrites their addresses and the operator's --no-store-peer-check is needed")
