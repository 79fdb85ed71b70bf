"""The JSON the operator reads from GET /v1/state (protocol_state.StateWire): a pure rendering of a decoded state and
the round history."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from elasticjob_store.actions import WAITER, has_waiter
from elasticjob_store.peers import normal
from elasticjob_store.protocol_state import (
    LinksWire,
    NodeCheckWire,
    NodeWire,
    PaceWire,
    PeersWire,
    ProgressWire,
    SeatsWire,
    StateWire,
    StopWire,
    TorchWire,
)
from elasticjob_store.rounds import RoundTracker
from elasticjob_store.state import NodeDesc, RendezvousState


def _age(state: RendezvousState, node: NodeDesc, now: float) -> float | None:
    beat: datetime | None = state.last_heartbeats.get(node)
    return None if beat is None else round(now - beat.timestamp(), 3)


def _node(state: RendezvousState, node: NodeDesc, now: float, stale_after: float,
          unanswered: Mapping[str, float], rank: int | None = None) -> NodeWire:
    age = _age(state, node, now)
    return {"addr": node.addr, "pid": node.pid, "localId": node.local_id, "rank": rank, "heartbeatAge": age,
            "stale": age is not None and age > stale_after, "unanswered": unanswered.get(normal(node.addr))}


def summary(state: RendezvousState | None, tracker: RoundTracker, now: float,
            stale_after: float) -> tuple[Any, ...]:
    """What the operator decides on; a change of it is worth waking the operator for (a long-poll answers).
    Heartbeat ages are not in it, only whether each is stale: they change every second."""
    if state is None:
        return (tracker.failure_rounds,)
    def nodes(found: Iterable[NodeDesc]) -> tuple[Any, ...]:
        return tuple(sorted((n.addr, n.pid, n.local_id, (_age(state, n, now) or 0) > stale_after) for n in found))
    return (state.round, state.complete, state.closed, nodes(state.participants),
            nodes(n for n in state.wait_list if n != WAITER), tracker.failure_rounds, has_waiter(state))


def node_ref(node: NodeDesc) -> dict[str, Any]:
    return {"addr": node.addr, "pid": node.pid, "localId": node.local_id}


def describe(state: RendezvousState | None, tracker: RoundTracker, *, now: float, epoch: str, run_id: str,
             min_nodes: int, max_nodes: int, version: int = 0, stale_after: float = 1e9,
             torch: TorchWire | None = None, progress: ProgressWire | None = None,
             stop: StopWire | None = None, pace: list[PaceWire] | None = None, peers: PeersWire | None = None,
             node_checks: list[NodeCheckWire] | None = None, links: LinksWire | None = None,
             seats: SeatsWire | None = None, unanswered: Mapping[str, float] | None = None) -> StateWire:
    """`epoch` changes when the store process restarts: the operator then knows the counts started over.
    `version` counts changes of the summary within the epoch. `torch`: compat.Verdict.report(), whether the
    store accepts nudges on this torch. `progress`: the training's latest report (progress.py), the tenant's
    word. `stop`: the planned stop last asked (its id, step and time), if any. `pace`: each pod's forward time
    (pace.py), the tenant's word too. `peers`: the gate's report (gate.py); None where no gate runs. `node_checks`:
    what each member of the latest round said its node check cost its join (nodechecks.py), the tenant's word.
    `links`: the latest round's link probe verdict, its outlier as an address (links.py), the tenant's word too.
    `seats`: for a job with spares, the seats' count, who holds one and which spares wait (seats.py); else None.
    `unanswered`: the addresses whose kernel has answered none of the store's TCP for a while, and for how many
    seconds (peers.Silences): each node's `unanswered`, the store's own word."""
    body: StateWire = {
        "torch": torch, "progress": progress, "stop": stop, "pace": pace or [], "peers": peers,
        "nodeChecks": node_checks or [], "links": links, "seats": seats,
        "epoch": epoch, "version": version, "runId": run_id, "now": now, "minNodes": min_nodes,
        "maxNodes": max_nodes, "staleAfter": stale_after,
        "round": None, "complete": False, "closed": False, "deadlineIn": None,
        "participants": [], "waiting": [], "redundant": [],
        "failureRounds": tracker.failure_rounds, "lastFailureRoundAt": tracker.last_failure_at,
        "rounds": [{"round": r.round, "nodes": list(r.nodes), "completedAt": r.completed_at,
                    "formingSince": r.forming_since} for r in tracker.rounds],
        "waiterActive": has_waiter(state),
    }
    if state is None:
        return body
    silent = unanswered or {}
    by_rank = sorted(state.participants.items(), key=lambda item: (item[1], item[0]))
    body.update({
        "round": state.round, "complete": state.complete, "closed": state.closed,
        "deadlineIn": None if state.deadline is None else round(state.deadline.timestamp() - now, 3),
        "participants": [_node(state, node, now, stale_after, silent, rank) for node, rank in by_rank],
        # The store's own waiter is reported as waiterActive, not as a node.
        "waiting": [_node(state, node, now, stale_after, silent) for node in sorted(state.wait_list) if node != WAITER],
        "redundant": [_node(state, node, now, stale_after, silent) for node in sorted(state.redundancy_list)],
    })
    return body
