"""Which rendezvous rounds formed, and which of them were failures: pure bookkeeping over observed states.

When a worker process fails, every agent restarts its workers in place and the same nodes form the next
round: a failure, which the operator charges to the job's restart budget. When nodes join or leave, the set
of nodes changes: a membership change, never charged. So a newly completed round whose set of node addresses
equals the previous completed round's is a failure round, unless the store's own restart (a waiter, see
actions.add_waiter) caused it.

A round also says when it began to form: the first poll that saw the round before it break up (one of its agents
left it, which an agent does once it stopped its workers to re-form) or saw it incomplete. The training paused no
later than that: for a script that reports no steps it is the one bound of the pause the store can give (the
agents' restart, to a poll's 0.25 s).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from elasticjob_store.state import RendezvousState

KEEP_ROUNDS = 10


@dataclass(frozen=True)
class CompletedRound:
    round: int
    nodes: tuple[str, ...]  # sorted participant addresses
    completed_at: float  # unix time the store first saw it complete
    failure: bool
    forming_since: float | None = None  # unix time the store first saw the round before it break up; None: not seen


class RoundTracker:
    """Fed every state the store reads, in order; remembers the last KEEP_ROUNDS completed rounds."""

    def __init__(self, keep: int = KEEP_ROUNDS) -> None:
        self.rounds: deque[CompletedRound] = deque(maxlen=keep)
        self.failure_rounds = 0
        self.last_failure_at: float | None = None
        self._last: CompletedRound | None = None
        self.restart_of: int | None = None  # the round the store's own restart ends
        self._forming: float | None = None  # when the last completed round was first seen breaking up

    def members(self, round_number: int) -> tuple[str, ...] | None:
        """The participants' addresses when that round completed, if this store saw it complete."""
        last = self._last
        return last.nodes if last is not None and last.round == round_number else None

    def note_restart(self, round_restarted: int) -> None:
        """The store put a waiter into `round_restarted`: the next round to form is ours, not a failure."""
        self.restart_of = round_restarted

    def track(self, state: RendezvousState | None, now: float) -> CompletedRound | None:
        """Records the state's round if it is complete and later than the last; returns it then, else None."""
        if state is None:
            return None
        if self._forming is None and self._breaking_up(state):
            self._forming = now
        if not state.complete:
            return None
        # Torch only ever raises the round. A lower or equal one is a stale or crafted write (anyone who can
        # reach the store can write the key); alternating two states must not charge a round per poll.
        if self._last is not None and state.round <= self._last.round:
            return None
        nodes = tuple(sorted({node.addr for node in state.participants}))
        ours = self.restart_of is not None and state.round > self.restart_of
        if ours:
            self.restart_of = None
        failure = self._last is not None and nodes == self._last.nodes and not ours
        completed = CompletedRound(state.round, nodes, now, failure, self._forming)
        self._forming = None
        if failure:
            self.failure_rounds += 1
            self.last_failure_at = now
        self.rounds.append(completed)
        self._last = completed
        return completed

    def _breaking_up(self, state: RendezvousState) -> bool:
        """The last completed round lost one of its agents, or a later round is forming. A crafted write can only
        move a time that is shown, never one that decides."""
        last = self._last
        if last is None:
            return not state.complete
        if state.round > last.round:
            return not state.complete
        members = {node.addr for node in state.participants}
        return state.round == last.round and state.complete and len(members) < len(last.nodes)
