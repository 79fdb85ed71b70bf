"""A store's GET /v1/state reply, parsed into the planner's StoreView.

The reply is untrusted input: anyone who reaches the store's port could have written torch's state. Nothing here
unpickles or evaluates it; sizes are capped and every field has a type and a range. Unreadable means "unknown":
the caller keeps what it knew. A bad entry of a list (a pace, a node check) or a bad verdict is dropped, not the
reply.
"""

from __future__ import annotations

import ipaddress
import json
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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
from elasticjob_store import protocol

# A reply of maxReplicas (at most 1024) agents, twice over, is about 115 KiB: anything larger is refused unread.
MAX_REPLY_BYTES = 128 << 10
# What the schema allows at most; a reply with more agents than the job's maxReplicas (participants, or waiting)
# is refused too (parse_state's max_nodes): planning is linear in them, but they are the tenant's word.
MAX_NODES = 1024
# What the operator logs of a store's own words (its `error`, `refused`): this long at most, printable only.
MAX_STORE_TEXT = 200


M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class _Node(_Strict):
    addr: str = Field(max_length=64)
    heartbeat_age: float | None = Field(None, alias="heartbeatAge", ge=-3600, le=1e9)
    stale: bool = False
    unanswered: float | None = Field(None, ge=0, le=1e9)

    @field_validator("addr")
    @classmethod
    def _ip(cls, value: str) -> str:
        ipaddress.ip_address(value)
        return value


class _Plain(_Strict):
    agents: int = Field(0, ge=0, le=1 << 40)
    why: str = Field("", max_length=1000)


class _Torch(_Strict):
    version: str = Field("", max_length=64)
    nudges: bool = True
    why: str = Field("", max_length=1000)
    checking: bool = False
    plain_torchrun: _Plain | None = Field(None, alias="plainTorchrun")


class _Mark(_Strict):
    step: int = Field(ge=0, le=1 << 53)
    at: float = Field(ge=0, le=1e11)


class _Progress(_Strict):
    """The training's report as the store checked it (elasticjob_store/progress.py); checked again here."""

    model_config = ConfigDict(extra="ignore", strict=False, populate_by_name=True)  # ints are fine as floats
    pod: str = Field("", max_length=253)
    restart: int = Field(0, ge=0, le=1 << 53)
    started_at: float | None = Field(None, alias="startedAt", ge=0, le=1e11)
    step: int | None = Field(None, ge=0, le=1 << 53)
    step_at: float | None = Field(None, alias="stepAt", ge=0, le=1e11)
    step_seconds: float | None = Field(None, alias="stepSeconds", ge=0, le=86400)
    first_step: int | None = Field(None, alias="firstStep", ge=0, le=1 << 53)
    first_step_at: float | None = Field(None, alias="firstStepAt", ge=0, le=1e11)
    saved: _Mark | None = None
    loading_at: float | None = Field(None, alias="loadingAt", ge=0, le=1e11)
    loaded: _Mark | None = None
    received_at: float | None = Field(None, alias="receivedAt", ge=0, le=1e11)
    listens: bool = False
    stopped: _Mark | None = None
    stalled: bool = False
    previous_pod: str = Field("", alias="previousPod", max_length=253)


class _Round(_Strict):
    """A round the store saw complete (elasticjob_store/rounds.py), when, on the store's clock."""

    model_config = ConfigDict(extra="ignore", strict=False, populate_by_name=True)
    round: int = Field(ge=0, le=1 << 40)
    completed_at: float = Field(alias="completedAt", ge=0, le=1e11)
    # When the store first saw the round before it break up (an agent re-forming); absent from older stores.
    forming_since: float | None = Field(None, alias="formingSince", ge=0, le=1e11)
    nodes: list[str] = Field(default_factory=list, max_length=MAX_NODES)

    @field_validator("nodes")
    @classmethod
    def _ips(cls, value: list[str]) -> list[str]:
        for addr in value:
            ipaddress.ip_address(addr)  # what a pod's IP compares with; anything else is no reply
        return value


class _Stop(_Strict):
    """The planned stop the store last wrote (elasticjob_store/control.py stop_record)."""

    model_config = ConfigDict(extra="ignore", strict=False, populate_by_name=True)
    id: str = Field(max_length=32)
    step: int = Field(ge=0, le=1 << 53)


class _Pace(_Strict):
    """One pod's forward time (elasticjob_store/pace.py by_pod): the slowest of its ranks, the tenant's word."""

    model_config = ConfigDict(extra="ignore", strict=False)  # ints are fine as floats
    pod: str = Field(min_length=1, max_length=253)
    seconds: float = Field(gt=0, le=3600)
    ranks: int = Field(ge=1, le=1 << 20)


class _NodeCheck(_Strict):
    """What an agent's node check cost its join (elasticjob_store/nodechecks.py), the tenant's word."""

    model_config = ConfigDict(extra="ignore", strict=False)
    addr: str = Field(min_length=1, max_length=64)
    held: float = Field(ge=0, le=7200)
    at: float = Field(ge=0, le=1e11)


class _Links(_Strict):
    """The link probe's verdict (elasticjob_store/links.py), the tenant's word."""

    model_config = ConfigDict(extra="ignore", strict=False)
    round: int = Field(ge=0, le=1 << 40)
    world: int = Field(ge=1, le=1 << 16)
    seconds: float = Field(ge=0, le=3600)
    outlier: str | None = Field(None, max_length=64)
    reason: str | None = Field(None, max_length=240)

    @field_validator("outlier")
    @classmethod
    def _ip(cls, value: str | None) -> str | None:
        return None if value is None else str(ipaddress.ip_address(value))


class _Peers(_Strict):
    """The store's gate (elasticjob_store/gate.py Gate.report): whom its port answers, whom it refused."""

    model_config = ConfigDict(extra="ignore", strict=False)
    told: bool = False
    allowed: list[str] = Field(default_factory=list, max_length=protocol.MAX_PEERS)
    refused: int = Field(0, ge=0, le=1 << 62)
    last_refused: list[str] = Field(default_factory=list, alias="lastRefused", max_length=64)

    @field_validator("allowed", "last_refused")
    @classmethod
    def _ips(cls, value: list[str]) -> list[str]:
        return [str(ipaddress.ip_address(addr)) for addr in value]  # anything else is no reply


class _Seats(_Strict):
    """The seats of a job with spares (elasticjob_store/seats.py describe)."""

    model_config = ConfigDict(extra="ignore", strict=False)
    count: int = Field(ge=1, le=1 << 20)
    held: list[str] = Field(default_factory=list, max_length=protocol.MAX_PEERS)
    spares: list[str] = Field(default_factory=list, max_length=protocol.MAX_PEERS)
    joining: list[str] = Field(default_factory=list, max_length=protocol.MAX_PEERS)

    @field_validator("held", "spares", "joining")
    @classmethod
    def _ips(cls, value: list[str]) -> list[str]:
        return [str(ipaddress.ip_address(addr)) for addr in value]  # anything else is no reply


class _State(_Strict):
    epoch: str = Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")
    round: int | None = Field(None, ge=0, le=1 << 40)
    complete: bool = False
    closed: bool = False
    participants: list[_Node] = Field(default_factory=list, max_length=MAX_NODES)
    waiting: list[_Node] = Field(default_factory=list, max_length=MAX_NODES)
    failure_rounds: int = Field(0, alias="failureRounds", ge=0, le=1 << 40)
    last_failure_round_at: float | None = Field(None, alias="lastFailureRoundAt", ge=0, le=1e11)
    version: int = Field(0, ge=0, le=1 << 62)
    waiter_active: bool = Field(False, alias="waiterActive")
    torch: _Torch | None = None  # absent from stores older than the check: they nudge as before
    progress: dict[str, Any] | None = None  # checked on its own: a bad report is dropped, not the reply
    stop: _Stop | None = None
    rounds: list[_Round] = Field(default_factory=list, max_length=64)  # the store keeps its last 10
    pace: list[Any] = Field(default_factory=list, max_length=256)  # each checked on its own
    peers: _Peers | None = None  # absent where the store has no gate
    node_checks: list[Any] = Field(default_factory=list, alias="nodeChecks", max_length=256)  # each on its own
    links: dict[str, Any] | None = None  # checked on its own: a bad verdict is dropped, not the reply
    seats: _Seats | None = None  # absent for a job without spares, and from older stores


def parse_state(raw: bytes, received_at: datetime | None = None, max_nodes: int = MAX_NODES) -> StoreView | None:
    """A store's /v1/state reply as the planner sees it; None when it is not a valid reply, or lists more agents
    (participants, or waiting) than the job may have (`max_nodes`: its maxReplicas)."""
    if len(raw) > MAX_REPLY_BYTES:
        return None
    try:
        state = _State.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None
    if len(state.participants) > max_nodes or len(state.waiting) > max_nodes:
        return None
    at = state.last_failure_round_at
    current = next((r for r in state.rounds if r.round == state.round), None)
    completed = current.completed_at if current is not None else None
    forming = current.forming_since if current is not None else None
    last = max(state.rounds, key=lambda r: r.round, default=None)
    return StoreView(
        epoch=state.epoch, round=state.round, complete=state.complete, closed=state.closed,
        participants=tuple(StoreNode(n.addr, n.heartbeat_age, n.stale, n.unanswered) for n in state.participants),
        waiting=tuple(StoreNode(n.addr, n.heartbeat_age, n.stale, n.unanswered) for n in state.waiting),
        failure_rounds=state.failure_rounds,
        last_failure_round_at=datetime.fromtimestamp(at, UTC) if at is not None else None,
        version=state.version, waiter_active=state.waiter_active, nudges_off=_nudges_off(state.torch),
        nudges_checked=state.torch is None or not state.torch.checking,
        plain_torchrun=_plain_torchrun(state.torch), progress=parse_progress(state.progress),
        stop_id=state.stop.id if state.stop else None, stop_step=state.stop.step if state.stop else None,
        round_completed_at=datetime.fromtimestamp(completed, UTC) if completed is not None else None,
        round_forming_since=datetime.fromtimestamp(forming, UTC) if forming is not None else None,
        last_round_nodes=tuple(last.nodes) if last is not None else (),
        pace=parse_pace(state.pace), peers=_peers(state.peers), node_checks=parse_node_checks(state.node_checks),
        links=parse_links(state.links), seats=_seats(state.seats),
        received_at=received_at or datetime.now(UTC))


def _seats(seats: _Seats | None) -> SeatsView | None:
    if seats is None:
        return None
    return SeatsView(seats.count, tuple(sorted(set(seats.held))), tuple(sorted(set(seats.spares))),
                     tuple(sorted(set(seats.joining))))


def _peers(peers: _Peers | None) -> PeersView | None:
    if peers is None:
        return None
    return PeersView(told=peers.told, allowed=tuple(sorted(set(peers.allowed))), refused=peers.refused,
                     last_refused=tuple(peers.last_refused))


def parse_progress(raw: dict[str, Any] | None) -> ProgressView | None:
    """The training's report, or None when there is none or it is not valid (the rest of the reply stands)."""
    found = valid_one(raw, _Progress)
    if found is None:
        return None

    def at(value: float | None) -> datetime | None:
        return None if value is None else datetime.fromtimestamp(value, UTC)

    saved, loaded, stopped = found.saved, found.loaded, found.stopped
    return ProgressView(
        pod=printable(found.pod), restart=found.restart, started_at=at(found.started_at), step=found.step,
        step_at=at(found.step_at), step_seconds=found.step_seconds, first_step=found.first_step,
        first_step_at=at(found.first_step_at), saved_step=saved.step if saved else None,
        saved_at=at(saved.at) if saved else None, loading_at=at(found.loading_at),
        loaded_step=loaded.step if loaded else None, loaded_at=at(loaded.at) if loaded else None,
        received_at=at(found.received_at), listens=found.listens, stalled=found.stalled,
        stopped_step=stopped.step if stopped else None, stopped_at=at(stopped.at) if stopped else None,
        previous_pod=printable(found.previous_pod))


def valid_one(raw: dict[str, Any] | None, model: type[M]) -> M | None:
    """An optional object of the reply if it is there and valid; None otherwise (the rest of the reply stands)."""
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def valid_entries(raw: list[Any], model: type[M]) -> list[M]:
    """Each entry of a list in the reply that is valid; one that is not is left out (the rest of the reply
    stands)."""
    found = []
    for entry in raw:
        try:
            found.append(model.model_validate(entry))
        except ValidationError:
            continue
    return found


def parse_pace(raw: list[Any]) -> tuple[PaceView, ...]:
    """The pods' paces."""
    return tuple(PaceView(pod=printable(pace.pod), seconds=pace.seconds, ranks=pace.ranks)
                 for pace in valid_entries(raw, _Pace))


def parse_node_checks(raw: list[Any]) -> tuple[NodeCheckView, ...]:
    """The node checks' costs."""
    return tuple(NodeCheckView(addr=check.addr, held=check.held, at=datetime.fromtimestamp(check.at, UTC))
                 for check in valid_entries(raw, _NodeCheck))


def parse_links(raw: dict[str, Any] | None) -> LinksView | None:
    """The link probe's verdict, or None when there is none or it is not valid (the rest of the reply stands)."""
    found = valid_one(raw, _Links)
    if found is None:
        return None
    reason = printable(found.reason) if found.reason is not None and found.outlier is not None else None
    return LinksView(round=found.round, world=found.world, seconds=found.seconds, outlier=found.outlier,
                     reason=reason)


def _nudges_off(torch: _Torch | None) -> str | None:
    if torch is None or torch.nudges:
        return None
    return printable(torch.why) or f"the store turned its nudges off on torch {printable(torch.version) or '(unknown)'}"


def _plain_torchrun(torch: _Torch | None) -> str | None:
    plain = torch.plain_torchrun if torch is not None else None
    if plain is None or plain.agents == 0:
        return None
    return f"{plain.agents} agent start(s) ran plain torchrun instead of elasticjob_warm's: {printable(plain.why)}"


def store_text(value: object) -> str:
    """A store's own words, fit for a log line: printable characters only, MAX_STORE_TEXT at most."""
    return printable(str(value)[:MAX_STORE_TEXT * 4])[:MAX_STORE_TEXT]


def printable(text: str) -> str:
    """Without control characters (newlines, escapes), which a store's words would otherwise carry into the
    job's conditions, Events and the operator's log: every character the store sends is the tenant's."""
    return "".join(ch if ch.isprintable() else " " for ch in text)

