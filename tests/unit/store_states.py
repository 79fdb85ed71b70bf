"""Real torch rendezvous states for the store's tests, built from a compact description."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

from elasticjob_store.rdzv_classes import STANDINS, Kinds, torch_kinds
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
               beats: dict[NodeDesc, float] | None = None, kinds: Kinds = STANDINS) -> Any:
    """participants in rank order; `beats` maps node -> seconds since its last heartbeat (default 1 s for
    every node mentioned). Made of `kinds`' classes: the store's stand-ins, or torch's own (an agent's), built
    in the same order so that even their sets' layouts match."""
    made: dict[NodeDesc, Any] = {}

    def node(n: NodeDesc) -> Any:
        return n if kinds is STANDINS else made.setdefault(n, kinds.node(n.addr, n.pid, n.local_id))

    state = kinds.state()
    state.round, state.complete, state.deadline, state.closed = round, complete, deadline, closed
    state.participants = {node(n): rank for rank, n in enumerate(participants)}
    state.wait_list = {node(n) for n in waiting}
    state.redundancy_list = {node(n) for n in redundant}
    if beats is None:
        beats = {n: 1.0 for n in (*participants, *waiting, *redundant)}
    state.last_heartbeats = {node(n): ago(age) for n, age in beats.items()}
    return state


def fields(state: RendezvousState) -> dict:
    return dict(vars(state))


def as_torch(state: RendezvousState) -> Any:
    """The same state made of torch's own classes, as an agent holds it."""
    kinds = torch_kinds()
    made: dict[NodeDesc, Any] = {}  # one object per node, shared by the lists, as in an agent's state

    def node(n: NodeDesc) -> Any:
        return made.setdefault(n, kinds.node(n.addr, n.pid, n.local_id))

    theirs = kinds.state()
    theirs.round, theirs.complete, theirs.deadline, theirs.closed = (state.round, state.complete, state.deadline,
                                                                     state.closed)
    theirs.participants = {node(n): rank for n, rank in state.participants.items()}
    theirs.wait_list = {node(n) for n in state.wait_list}
    theirs.redundancy_list = {node(n) for n in state.redundancy_list}
    theirs.last_heartbeats = {node(n): at for n, at in state.last_heartbeats.items()}
    return theirs


def agent_pickle(state: RendezvousState, protocol: int | None = None) -> bytes:
    """pickle.dumps of the state as an agent writes it: torch's classes (c10d_rendezvous_backend.set_state)."""
    return pickle.dumps(as_torch(state), protocol=protocol)
