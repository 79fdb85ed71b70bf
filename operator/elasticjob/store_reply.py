"""A store's GET /v1/state reply, parsed into the planner's StoreView.

The reply's shape and its checks are the store's protocol (elasticjob_store/protocol_state.py, StateWire), which
the store writes its reply with: this module maps the checked reply to the planner's view. The reply is untrusted
input: anyone who reaches the store's port could have written torch's state. Nothing here unpickles or evaluates
it; sizes are capped and every field has a type and a range. Unreadable means "unknown": the caller keeps what it
knew. A bad entry of a list (a pace, a node check) or a bad verdict is dropped, not the reply.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from elasticjob.observe import (
    LinksView,
    NodeCheckView,
    PaceView,
    PeersView,
    ProgressView,
    SeatsView,
    StoreNode,
    StoreView,
)
from elasticjob_store import protocol_state
from elasticjob_store.protocol_state import LinksWire, NodeWire, PeersWire, ProgressWire, SeatsWire, TorchWire

# A reply of maxReplicas (at most 1024) agents, twice over, is about 115 KiB: anything larger is refused unread.
MAX_REPLY_BYTES = 128 << 10
# What the protocol allows at most; a reply with more agents than the job's maxReplicas (participants, or waiting)
# is refused too (parse_state's max_nodes): planning is linear in them, but they are the tenant's word.
MAX_NODES = protocol_state.MAX_NODES
# What the operator logs of a store's own words (its `error`, `refused`): this long at most, printable only.
MAX_STORE_TEXT = 200


def parse_state(raw: bytes, received_at: datetime | None = None, max_nodes: int = MAX_NODES) -> StoreView | None:
    """A store's /v1/state reply as the planner sees it; None when it is not a valid reply, or lists more agents
    (participants, or waiting) than the job may have (`max_nodes`: its maxReplicas)."""
    if len(raw) > MAX_REPLY_BYTES:
        return None
    try:
        state = protocol_state.read_state(json.loads(raw))
    except (ValueError, RecursionError):  # not JSON (or nested too deep for the parser), or not a reply (Invalid)
        return None
    if len(state["participants"]) > max_nodes or len(state["waiting"]) > max_nodes:
        return None
    at = state["lastFailureRoundAt"]
    rounds = state["rounds"]
    current = next((r for r in rounds if r["round"] == state["round"]), None)
    completed = current["completedAt"] if current is not None else None
    forming = current["formingSince"] if current is not None else None
    last = max(rounds, key=lambda r: r["round"], default=None)
    stop, torch = state["stop"], state["torch"]
    return StoreView(
        epoch=state["epoch"], round=state["round"], complete=state["complete"], closed=state["closed"],
        participants=_nodes(state["participants"]), waiting=_nodes(state["waiting"]),
        failure_rounds=state["failureRounds"], last_failure_round_at=_at(at), version=state["version"],
        waiter_active=state["waiterActive"], nudges_off=_nudges_off(torch),
        nudges_checked=torch is None or not torch["checking"], plain_torchrun=_plain_torchrun(torch),
        progress=_progress(state["progress"]), stop_id=stop["id"] if stop else None,
        stop_step=stop["step"] if stop else None, round_completed_at=_at(completed),
        round_forming_since=_at(forming), last_round_nodes=tuple(last["nodes"]) if last is not None else (),
        pace=tuple(PaceView(pod=printable(pace["pod"]), seconds=pace["seconds"], ranks=pace["ranks"])
                   for pace in state["pace"]),
        peers=_peers(state["peers"]),
        node_checks=tuple(NodeCheckView(addr=check["addr"], held=check["held"], at=_utc(check["at"]))
                          for check in state["nodeChecks"]),
        links=_links(state["links"]), seats=_seats(state["seats"]), received_at=received_at or datetime.now(UTC))


def _utc(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _at(value: float | None) -> datetime | None:
    return None if value is None else _utc(value)


def _nodes(found: list[NodeWire]) -> tuple[StoreNode, ...]:
    return tuple(StoreNode(n["addr"], n["heartbeatAge"], n["stale"], n["unanswered"]) for n in found)


def _seats(seats: SeatsWire | None) -> SeatsView | None:
    if seats is None:
        return None
    return SeatsView(seats["count"], tuple(sorted(set(seats["held"]))), tuple(sorted(set(seats["spares"]))),
                     tuple(sorted(set(seats["joining"]))))


def _peers(peers: PeersWire | None) -> PeersView | None:
    if peers is None:
        return None
    return PeersView(told=peers["told"], allowed=tuple(sorted(set(peers["allowed"]))), refused=peers["refused"],
                     last_refused=tuple(peers["lastRefused"]))


def parse_progress(raw: Any) -> ProgressView | None:
    """The training's report alone (the store's progress.describe), or None when there is none or it is not
    valid."""
    return _progress(protocol_state.read_progress(raw))


def _progress(found: ProgressWire | None) -> ProgressView | None:
    if found is None:
        return None
    saved, loaded, stopped = found["saved"], found["loaded"], found["stopped"]
    return ProgressView(
        pod=printable(found["pod"]), restart=found["restart"], started_at=_at(found["startedAt"]),
        step=found["step"], step_at=_at(found["stepAt"]), step_seconds=found["stepSeconds"],
        first_step=found["firstStep"], first_step_at=_at(found["firstStepAt"]),
        saved_step=saved["step"] if saved else None, saved_at=_at(saved["at"]) if saved else None,
        loading_at=_at(found["loadingAt"]), loaded_step=loaded["step"] if loaded else None,
        loaded_at=_at(loaded["at"]) if loaded else None, received_at=_at(found["receivedAt"]),
        listens=found["listens"], stalled=found["stalled"], stopped_step=stopped["step"] if stopped else None,
        stopped_at=_at(stopped["at"]) if stopped else None, previous_pod=printable(found["previousPod"]))


def _links(found: LinksWire | None) -> LinksView | None:
    if found is None:
        return None
    reason = printable(found["reason"]) if found["reason"] is not None and found["outlier"] is not None else None
    return LinksView(round=found["round"], world=found["world"], seconds=found["seconds"],
                     outlier=found["outlier"], reason=reason)


def _nudges_off(torch: TorchWire | None) -> str | None:
    if torch is None or torch["nudges"]:
        return None
    version = printable(torch["version"]) or "(unknown)"
    return printable(torch["why"]) or f"the store turned its nudges off on torch {version}"


def _plain_torchrun(torch: TorchWire | None) -> str | None:
    plain = torch["plainTorchrun"] if torch is not None else None
    if plain is None or plain["agents"] == 0:
        return None
    why = printable(plain["why"])
    return f"{plain['agents']} agent start(s) ran plain torchrun instead of elasticjob_warm's: {why}"


def store_text(value: object) -> str:
    """A store's own words, fit for a log line: printable characters only, MAX_STORE_TEXT at most."""
    return printable(str(value)[:MAX_STORE_TEXT * 4])[:MAX_STORE_TEXT]


def printable(text: str) -> str:
    """Without control characters (newlines, escapes), which a store's words would otherwise carry into the
    job's conditions, Events and the operator's log: every character the store sends is the tenant's."""
    return "".join(ch if ch.isprintable() else " " for ch in text)

