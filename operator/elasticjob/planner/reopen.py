"""A rendezvous closed while the job still trains is opened again. Pure.

torch's agents close the rendezvous only when the job is over (an agent's run ended). A closed round while no
worker finished is someone else's write (one of the job's own pods: the store answers no other), and every agent
that syncs, and every replacement, would leave on it (the kit's agent exits RENDEZVOUS_EXIT: RendezvousFailed,
not charged). The operator asks the store for an open round after it once it has its own evidence: an agent of an
admitted pod left on the rendezvous (its exit code and line) while no worker exited 0.
"""

from __future__ import annotations

from elasticjob.planner.base import Event, Job, Observed, Plan, StoreAction
from elasticjob.planner.recovery import control_endpoint
from elasticjob_store.protocol import Reopen


def reopen_closed(plan: Plan, job: Job, observed: Observed) -> None:
    store, endpoint = observed.store, control_endpoint(observed, job)
    if store is None or not store.closed or store.round is None or endpoint is None or store.nudges_off:
        return
    if observed.by_state.finished:
        return  # the training finished: the agents closed it, as torch does at the end
    left = [pod for pod in observed.workers if pod.rendezvous_failed]
    if not left:
        return  # no evidence of ours yet: a closure seen before the pod that finished is
    plan.act(StoreAction(Reopen(store.round), endpoint, Event(
        "Warning", "RendezvousReopened",
        f"round {store.round} of the rendezvous was closed while no worker had finished (pod {left[0].name}'s agent "
        f"left on it: {left[0].rendezvous_failed}); the store opened round {store.round + 1}, where the agents "
        f"join again")))
