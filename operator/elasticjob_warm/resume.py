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

The end: once its workers succeed, torch's agent waits (up to exit_barrier_timeout, 300 s) until every agent of
its round has counted in on the round's store, the one it took when the round formed: after a resume, the lost
store's client, so it waits on the handler's store (the new one, under the same round's prefix). A peer that
left while there was no store (its workers succeeded then, and its barrier failed on the lost store), that had
counted on the lost store before it went, or whose workers succeeded while it was still away from the new one,
never counts there: the agent waited the whole 300 s, and the job sat Completing. So the barrier also ends once
every rank still in the round is at its end (a key per rank beside torch's count): a rank torch's dead-node check
has taken out of the round is not waited for, at most keep_alive_interval x keep_alive_max_attempt after the
resume gave it that budget. An agent whose workers run heartbeats, so it is waited for, as torch's barrier does.
This is every round's barrier, resumed or not, and it reads the store in short calls: torch's blocking wait held
up the agent's own heartbeats for as long as it waited.

Touches private names of torch's handler (`_this_node`, `_heartbeat_lock`, `_state_holder` and the holder's
`_state`, `_dirty`, `_last_sync_time`, `state`, `sync`), of its agent (`_exit_barrier`, `_exit_barrier_timeout`,
`_in_exit_barrier`, `_store`, `_worker_group`) and of its barrier (`_barrier_nonblocking`,
`_TERMINAL_STATE_SYNC_ID`), checked where used: a torch without them restarts the workers, or waits at its end as
torch's agent does, as before.
"""

from __future__ import annotations

import copy
import pickle
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

HOLDER_NAMES = ("_state", "_dirty", "_last_sync_time", "_backend", "sync")
RESUMED = "_elasticjob_resumed"  # on the handler: its round was resumed on a store that came back
# Between an agent's looks at its peers at its end (torch's agent polls its workers as often).
END_POLL_SECONDS = 0.1
# Under torch's exit-barrier prefix, one key per rank at its end: which ranks, where torch counts only how many.
ARRIVED = "elasticjob_arrived"


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


def present_ranks(handler: Any) -> Callable[[], set[int] | None] | None:
    """A reader of the ranks torch still counts in this agent's round: the round's participants as the agent's own
    state holder reads them, which takes out (torch's `_sanitize`) every node without a heartbeat for
    keep_alive_interval x keep_alive_max_attempt. The reader returns None where the store holds another round, or
    one without this agent: nothing is known then of its peers. None (no reader) where the handler lacks the names.
    """
    holder = getattr(handler, "_state_holder", None)
    node = getattr(handler, "_this_node", None)
    lock = getattr(handler, "_heartbeat_lock", None)
    if holder is None or node is None or lock is None or not hasattr(holder, "sync") \
            or not hasattr(getattr(holder, "state", None), "round"):
        return None
    round_ = holder.state.round

    def read() -> set[int] | None:
        with lock:  # the heartbeat thread syncs the same holder
            holder.sync()
            state = holder.state
        if state.round != round_ or node not in state.participants:
            return None
        return set(state.participants.values())
    return read


def end_barrier(store: Any, rank: int, world_size: int, timeout: float, present: Callable[[], set[int] | None],
                key_prefix: str) -> list[int]:
    """torch's exit barrier (its count under `key_prefix`, and the key that the last agent to count sets), which
    also ends once every rank still in the round (`present`) has reached its end: a peer gone from the round is
    not waited for. Returns the ranks not waited for; raises TimeoutError after `timeout` seconds, and what the
    store raises (a lost store: torch's agent leaves at once, as with its own barrier)."""
    from torch.distributed.elastic.utils import store as store_util

    deadline = time.monotonic() + timeout
    arrived = f"{key_prefix}/{ARRIVED}/"
    store.set(f"{arrived}{rank}", b"")  # before the count: a peer that sees the count complete needs no more
    last = store_util._barrier_nonblocking(store=store, world_size=world_size, key_prefix=key_prefix)
    while not store.check([last]):  # short reads, unlike torch's blocking wait, which held the heartbeats up
        ranks = present()
        if ranks is not None and (gone := set(range(world_size)) - ranks) \
                and all(store.check([f"{arrived}{r}"]) for r in ranks if r != rank):
            return sorted(gone)
        if time.monotonic() >= deadline:
            waited = sorted(r for r in (ranks or range(world_size)) if r != rank)
            raise TimeoutError(f"the exit barrier waited {timeout:g} s for rank(s) {waited} of {world_size}")
        time.sleep(END_POLL_SECONDS)
    return []


def apply_exit_barrier() -> bool:
    """torch's agent waits at its end (up to exit_barrier_timeout, 300 s) until every agent of its last round has
    counted in on that round's store, which it took when the round formed. Here it waits on the handler's store
    (after a resume: the new one, under the same round's prefix), and only for the agents still in the round
    (`end_barrier`): a peer that left while there was no store, or that counted on the lost store, never counts on
    the new one, and held the agent 300 s. False (nothing patched) when this torch's agent lacks the names; a
    handler without the names gets torch's own barrier, on its store."""
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.utils import store as store_util

    agent: Any = getattr(api, "SimpleElasticAgent", None)
    torch_end = getattr(agent, "_exit_barrier", None)
    key_prefix = getattr(api, "_TERMINAL_STATE_SYNC_ID", None)
    if torch_end is None or not isinstance(key_prefix, str) or not hasattr(store_util, "_barrier_nonblocking") \
            or not all(hasattr(api, name) for name in ("logger", "SignalException")):
        return False
    if getattr(torch_end, "_elasticjob_resume", False):
        return True
    torch_api: Any = api  # its stubs do not export SignalException
    logger, stopped = torch_api.logger, torch_api.SignalException

    def _exit_barrier(self: Any) -> Any:
        group = self._worker_group
        handler = getattr(getattr(group, "spec", None), "rdzv_handler", None)
        if handler is not None and handler.__dict__.get(RESUMED) and hasattr(handler, "_get_store"):
            self._store = handler._get_store()
        present = present_ranks(handler)
        if present is None:
            return torch_end(self)
        # torch's own _exit_barrier from here on (its log lines, its flag, its errors), with end_barrier.
        logger.info("Local worker group finished (%s). Waiting %s seconds for other agents to finish",
                    group.state, self._exit_barrier_timeout)
        start = time.time()
        self._in_exit_barrier = True
        try:
            gone = end_barrier(self._store, group.group_rank, group.group_world_size, self._exit_barrier_timeout,
                               present, key_prefix)
            if gone:
                log(f"the exit barrier did not wait for rank(s) {', '.join(map(str, gone))} of "
                    f"{group.group_world_size}: gone from the round (no heartbeat), every other one is at its end")
            logger.info("Done waiting for other agents. Elapsed: %s seconds", time.time() - start)
        except stopped as error:
            logger.warning("Got termination signal: %s", error.sigval)
            raise
        except Exception:
            logger.exception("Error waiting on exit barrier. Elapsed: %s seconds", time.time() - start)
        finally:
            self._in_exit_barrier = False
        return None

    _exit_barrier._elasticjob_resume = True  # type: ignore[attr-defined]
    agent._exit_barrier = _exit_barrier
    return True


def log(message: str) -> None:
    print(f"elasticjob_warm.torchrun: {message}", file=sys.stderr, flush=True)
