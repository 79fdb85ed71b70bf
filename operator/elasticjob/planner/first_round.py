"""A job's first round waits, a bounded while, for its workers still starting. Pure.

torch completes a round once its last call (spec.rendezvous.lastCallTimeoutSeconds) has passed since its min-th
node joined. At a job's start, and after a preemption (which starts a new store), the agents join as their pods
come up, seconds apart: one that joins later than the last call finds the round formed, and the whole group
restarts at once, before or just after its first steps (1 start in 2 in an e2e once the store served within
0.4 s of its container's start). So while workers of the job are on a node but their agents are not in round 0,
the store holds that round's last call open, FIRST_ROUND_HOLD seconds at most from its first hold; once every
live worker's agent is in, complete_early (recovery.py) ends it at once. A worker slower than that joins later,
as a scale-up does: a restart, not a job held back.
"""

from __future__ import annotations

from elasticjob.observe import StoreView
from elasticjob.planner import spares
from elasticjob.planner.base import ControlAddress, Event, Job, Observed, Plan, StoreAction
from elasticjob_store.protocol import Hold

FIRST_ROUND_HOLD = 10.0


def hold_first_round(plan: Plan, job: Job, observed: Observed, store: StoreView, endpoint: ControlAddress) -> bool:
    """Asks the store to hold round 0's last call for the workers still starting; whether it asked."""
    if store.round != 0 or store.complete or not store.participants:
        return False
    joined = {n.addr for n in store.participants}
    if len(joined) >= job.ref.spec.max_replicas:
        return False  # torch completes the round at its max nodes anyway
    if store.seats is not None and len(joined) >= store.seats.count:
        return False  # every seat is in the round: the pods still starting are spares
    left_out = set(plan.status.rendezvous.left_out)
    waiting = spares.spare_ips(observed)
    coming = sorted(p.name for p in observed.by_state.active
                    if p.live and p.node and p.uid not in left_out and p.node_check_failed is None
                    and p.ip not in joined and p.ip not in waiting)
    if not coming:
        return False
    shown = ", ".join(coming[:3]) + (f" and {len(coming) - 3} more" if len(coming) > 3 else "")
    plan.act(StoreAction(Hold(0, FIRST_ROUND_HOLD), endpoint, Event(
        "Normal", "FirstRoundHeld", f"round 0 waits up to {FIRST_ROUND_HOLD:.0f} s for {len(coming)} worker(s) "
        f"still starting ({shown}), so that the job starts at its size")))
    return True
