"""The running round written back to a store that came back empty, so that its workers train on.

A store that came back (its container restarted, its pod replaced) holds nothing: torch's agents would see no round
and form a new one, restarting every worker for a membership that did not change (about a second lost per loss,
and four from the loss to the first step of the new workers). Instead, the first agent back writes the round it
was running, as it last read it, into the new store, and every agent that finds that same round there goes on in
it; their workers never stop. The write is torch's own compare-and-set against the new store's empty marker: only
the first agent's lands, and the others read it.

Why this makes no second world: an agent resumes only from its monitoring loop while its workers run, as a
participant of a complete round, and goes on only where the store holds that very round (number, participants and
ranks). An agent that was joining a round meanwhile (its workers stopped) does not resume: torch starts every join
by taking the agent out of the participants, so it waits in the resumed round's wait list, and the running agents
restart into a new round with it, as for a scale-up. An agent whose view differs from what the store holds
restarts its workers through a new round, as before this module.

The heartbeats: nobody could heartbeat while there was no store, so each one written back is moved on by the time
this agent was without one; torch's dead-node check then gives every agent the budget it had when the store went.
A node lost with the store (its agent never comes back) runs out of that budget as it would have, and the
operator's evidence (its pod gone) takes it out sooner.

Touches private names of torch's handler (`_this_node`, `_heartbeat_lock`, `_state_holder` and the holder's
`_state`, `_dirty`, `_last_sync_time`) and of its agent (`_exit_barrier`, `_store`, `_worker_group`), checked
where used: a torch without them restarts the workers, as before.
"""

from __future__ import annotations

import copy
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any

HOLDER_NAMES = ("_state", "_dirty", "_last_sync_time", "_backend", "sync")
RESUMED = "_elasticjob_resumed"  # on the handler: its round was resumed on a store that came back


def running_in(state: Any, node: Any) -> bool:
    """Whether `state` is a complete, open round with `node` among its participants."""
    return bool(getattr(state, "complete", False)) and not getattr(state, "closed", True) \
        and node in getattr(state, "participants", {})


def same_round(found: Any, mine: Any, node: Any) -> bool:
    """Whether the store holds the round this agent runs: same number, same participants with the same ranks."""
    return running_in(found, node) and running_in(mine, node) and found.round == mine.round \
        and dict(found.participants) == dict(mine.participants)


def moved_on(state: Any, gone: timedelta, now: datetime) -> Any:
    """A copy of `state` whose heartbeats are `gone` later (never past `now`): the time without a store."""
    seed = copy.deepcopy(state)
    seed.last_heartbeats = {node: min(beat + gone, now) for node, beat in seed.last_heartbeats.items()}
    return seed


def resume(handler: Any, gone_seconds: float) -> int | None:
    """Writes this agent's round into the handler's (new, empty) store, or reads the one another agent wrote.
    Returns the number of nodes waiting in it (0: the workers train on), or None where the round cannot be resumed
    here (the caller restarts the workers). Raises what the store raises when it is gone again."""
    holder = getattr(handler, "_state_holder", None)
    node = getattr(handler, "_this_node", None)
    lock = getattr(handler, "_heartbeat_lock", None)
    if holder is None or node is None or lock is None or not all(hasattr(holder, n) for n in HOLDER_NAMES):
        return None
    mine = holder._state
    if not running_in(mine, node):
        return None
    with lock:  # the heartbeat thread syncs the same holder
        seed = moved_on(mine, timedelta(seconds=max(0.0, gone_seconds)), datetime.now(timezone.utc))
        holder._backend.set_state(pickle.dumps(seed), None)  # lands only on the store's empty marker
        holder._dirty, holder._last_sync_time = False, -1
        holder.sync()  # reads back what the store holds now, through the agent's own decoder
        found = holder._state
    if not same_round(found, mine, node):
        return None
    handler.__dict__[RESUMED] = True
    return len(found.wait_list)


def apply_exit_barrier() -> bool:
    """torch's agent waits for the others at its end on the store of its last round, which it took when that round
    formed: after a resume that is the lost store's client. Hands it the handler's store (the new one, under the
    same round's prefix) first. False (nothing patched) when this torch's agent lacks the names."""
    from torch.distributed.elastic.agent.server import api

    agent: Any = getattr(api, "SimpleElasticAgent", None)
    barrier = getattr(agent, "_exit_barrier", None)
    if barrier is None:
        return False
    if getattr(barrier, "_elasticjob_resume", False):
        return True

    def _exit_barrier(self: Any) -> Any:
        handler = getattr(getattr(getattr(self, "_worker_group", None), "spec", None), "rdzv_handler", None)
        if handler is not None and handler.__dict__.get(RESUMED) and hasattr(handler, "_get_store"):
            self._store = handler._get_store()
        return barrier(self)

    _exit_barrier._elasticjob_resume = True  # type: ignore[attr-defined]
    agent._exit_barrier = _exit_barrier
    return True
