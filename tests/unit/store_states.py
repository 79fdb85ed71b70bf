"""Real torch rendezvous states for the store's tests, built from a compact description."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from elasticjob_store.state import NodeDesc, RendezvousState

# The real time: torch's own code, which some tests run on these states, compares with its clock.
NOW = datetime.now(UTC)
A, B, C = NodeDesc("10.0.0.1", 1, 0), NodeDesc("10.0.0.2", 1, 0), NodeDesc("10.0.0.3", 1, 0)
# A replacement pod that reused A's IP: same address, another agent.
A2 = NodeDesc("10.0.0.1", 7, 0)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def make_state(*, round: int = 0, complete: bool = False, deadline: datetime | None = None,
               closed: bool = False, participants=(), waiting=(), redundant=(),
               beats: dict[NodeDesc, float] | None = None) -> RendezvousState:
    """participants in rank order; `beats` maps node -> seconds since its last heartbeat (default 1 s for
    every node mentioned)."""
    state = RendezvousState()
    state.round, state.complete, state.deadline, state.closed = round, complete, deadline, closed
    state.participants = {node: rank for rank, node in enumerate(participants)}
    state.wait_list = set(waiting)
    state.redundancy_list = set(redundant)
    if beats is None:
        beats = {node: 1.0 for node in (*participants, *waiting, *redundant)}
    state.last_heartbeats = {node: ago(age) for node, age in beats.items()}
    return state


def fields(state: RendezvousState) -> dict:
    return dict(vars(state))
