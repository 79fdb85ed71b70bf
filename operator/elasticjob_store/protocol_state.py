"""GET /v1/state's reply, written once: its shape as types, and the checks the operator reads it with.

The store writes its reply as these TypedDicts (report.describe and the modules it gathers from, checked by mypy);
the operator reads the same reply back into them with `read_state`, every field checked for its type and range,
and maps it to its own view (elasticjob.store_reply). Anyone who reaches the store's port can write torch's state
and the training's reports, so the reply is untrusted input to the operator: nothing here unpickles or evaluates
it, every list is capped, and a field it does not know is skipped (a store may grow its reply).

A bad required field makes the whole reply unreadable (Invalid). The tenant's own reports are read one by one: a
bad progress report or link verdict is read as none, a bad pace or node check entry is left out; the rest of the
reply stands.

Standard library only, as protocol.py, and its field checks are protocol_checks.py's: the store runs on the job's
Python (3.9 included).
"""

from __future__ import annotations

from typing import Any, Optional, TypedDict, cast

from elasticjob_store.protocol_checks import (
    MAX_PEERS,
    REQUIRED,
    Check,
    Invalid,
    integer,
    ip,
    optional,
    seconds,
    unix_time,
)

# What the schema allows at most in one reply's lists of agents (participants, or waiting): maxReplicas' cap.
MAX_NODES = 1024
MAX_STEP = 2**53
MAX_ROUND = 2**40
MAX_COUNT = 2**62


# The reply's parts, as the store writes them. The annotations are never evaluated on the store's Python.

class NodeWire(TypedDict):
    """An agent of the rendezvous: its address, how old its last heartbeat is, whether that is stale, and for
    how long its kernel has answered none of the store's TCP (peers.Silences), if it has stopped."""

    addr: str
    pid: int
    localId: int
    rank: int | None  # a participant's; None while waiting
    heartbeatAge: float | None
    stale: bool
    unanswered: float | None


class PlainTorchrunWire(TypedDict):
    """How many agent starts ran plain torchrun instead of the warm wrapper, and its word why."""

    agents: int
    why: str


class TorchWire(TypedDict):
    """The store's check of the job's torch (compat.py): whether it nudges the agents' rendezvous."""

    version: str
    nudges: bool
    why: str
    checking: bool
    plainTorchrun: PlainTorchrunWire | None


class MarkWire(TypedDict):
    step: int
    at: float


class ProgressWire(TypedDict):
    """The training's report (progress.py), as the store checked it, with when the store first saw it."""

    pod: str
    restart: int
    stepSeconds: float | None
    listens: bool
    interval: float | None
    startedAt: float | None
    stepAt: float | None
    firstStepAt: float | None
    loadingAt: float | None
    sentAt: float | None
    step: int | None
    firstStep: int | None
    saved: MarkWire | None
    loaded: MarkWire | None
    stopped: MarkWire | None
    receivedAt: float | None
    stalled: bool
    previousPod: str


class StopWire(TypedDict):
    """The planned stop the store last wrote (control.py): its name, the step every rank stops after, when."""

    id: str
    step: int
    at: float


class RoundWire(TypedDict):
    """A round the store saw complete (rounds.py), on its clock; formingSince: when it first saw the round break
    up before it (an agent re-forming)."""

    round: int
    nodes: list[str]
    completedAt: float
    formingSince: float | None


class PaceWire(TypedDict):
    """One pod's forward time (pace.py): the slowest of its ranks."""

    pod: str
    seconds: float
    ranks: int


class NodeCheckWire(TypedDict):
    """What an agent's node check cost its join (nodechecks.py)."""

    addr: str
    seconds: float
    held: float
    at: float


class LinksWire(TypedDict):
    """The link probe's verdict on a round (links.py), its outlier as an address."""

    round: int
    world: int
    seconds: float
    outlier: str | None
    reason: str | None


class PeersWire(TypedDict):
    """The store's gate (gate.py): whom its port answers, whom it refused."""

    checked: bool
    told: bool
    allowed: list[str]
    refused: int
    lastRefused: list[str]
    held: int


class SeatsWire(TypedDict):
    """The seats of a job with spares (seats.py): how many, who holds one, which spares wait."""

    count: int
    held: list[str]
    spares: list[str]
    joining: list[str]
    granted: int


class StateWire(TypedDict):
    """The whole reply (report.describe). `epoch` changes when the store restarts; `version` counts changes of
    what the operator decides on within it."""

    epoch: str
    version: int
    runId: str
    now: float
    minNodes: int
    maxNodes: int
    staleAfter: float
    round: int | None
    complete: bool
    closed: bool
    deadlineIn: float | None
    participants: list[NodeWire]
    waiting: list[NodeWire]
    redundant: list[NodeWire]
    failureRounds: int
    lastFailureRoundAt: float | None
    rounds: list[RoundWire]
    waiterActive: bool
    torch: TorchWire | None  # absent from stores older than the check: they nudge as before
    progress: ProgressWire | None
    stop: StopWire | None
    pace: list[PaceWire]
    peers: PeersWire | None  # None where the store has no gate
    nodeChecks: list[NodeCheckWire]
    links: LinksWire | None
    seats: SeatsWire | None  # None for a job without spares, and from older stores


# The operator's reading: each field's check and its value where the reply leaves the field out.

Shape = dict[str, tuple[Check, Any]]  # field -> (check, default); REQUIRED: no default


def number(low: float, high: float, above: bool = False) -> Check:
    """An int or a float within [low, high] (above: > low): NaN and infinities are not. From 0 up to `high`,
    protocol_checks.seconds says the same."""
    def check(name: str, value: Any) -> float:
        if type(value) not in (int, float) or not (low < value if above else low <= value) or not value <= high:
            raise Invalid(f"{name} must be a number from {low:g} to {high:g}")
        return float(value)
    return check


def text(high: int, low: int = 0) -> Check:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or not low <= len(value) <= high:
            raise Invalid(f"{name} must be a string of {low} to {high} characters")
        return value
    return check


def flag(name: str, value: Any) -> bool:
    if type(value) is not bool:
        raise Invalid(f"{name} must be true or false")
    return value


def hex_word(name: str, value: Any) -> str:
    text(64, 1)(name, value)
    if value.strip("0123456789abcdef"):
        raise Invalid(f"{name} must be lowercase hexadecimal")
    return cast(str, value)


def listed(check: Check, high: int) -> Check:
    """A list of at most `high` entries, each checked: one bad entry is a bad list."""
    def read(name: str, value: Any) -> list[Any]:
        if not isinstance(value, list) or len(value) > high:
            raise Invalid(f"{name} must be a list of at most {high}")
        return [check(name, item) for item in value]
    return read


def kept(check: Check, high: int) -> Check:
    """A list of at most `high` entries, each checked on its own: a bad entry is left out, not the list."""
    def read(name: str, value: Any) -> list[Any]:
        if not isinstance(value, list) or len(value) > high:
            raise Invalid(f"{name} must be a list of at most {high}")
        found = []
        for item in value:
            try:
                found.append(check(name, item))
            except Invalid:
                continue
        return found
    return read


def lenient(check: Check) -> Check:
    """An object checked on its own: a bad one is read as none (None), not a bad reply."""
    def read(name: str, value: Any) -> Any:
        try:
            return optional(check)(name, value)
        except Invalid:
            return None
    return read


def obj(shape: Shape) -> Check:
    """A JSON object read by `shape`: each known field checked (or its default), unknown fields skipped."""
    def read(name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise Invalid(f"{name} must be a JSON object")
        found: dict[str, Any] = {}
        for field, (check, default) in shape.items():
            if field in value:
                found[field] = check(f"{name}.{field}", value[field])
            elif default is REQUIRED:
                raise Invalid(f"{name} has no {field}")
            else:
                found[field] = default() if callable(default) else default
        return found
    return read


def ip_list(high: int) -> Check:
    return listed(ip, high)


UNIX = unix_time
STEP = integer(0, MAX_STEP)

NODE: Shape = {
    "addr": (ip, REQUIRED), "pid": (integer(-1, MAX_COUNT), -1), "localId": (integer(-1, MAX_COUNT), -1),
    "rank": (optional(integer(0, 1 << 20)), None),
    "heartbeatAge": (optional(number(-3600, 1e9)), None), "stale": (flag, False),
    "unanswered": (optional(seconds(1e9)), None),
}
PLAIN: Shape = {"agents": (integer(0, 1 << 40), 0), "why": (text(1000), "")}
TORCH: Shape = {
    "version": (text(64), ""), "nudges": (flag, True), "why": (text(1000), ""), "checking": (flag, False),
    "plainTorchrun": (optional(obj(PLAIN)), None),
}
MARK: Shape = {"step": (STEP, REQUIRED), "at": (UNIX, REQUIRED)}
PROGRESS: Shape = {
    "pod": (text(253), ""), "restart": (STEP, 0), "stepSeconds": (optional(seconds(86400)), None),
    "listens": (flag, False), "interval": (optional(seconds(3600)), None),
    **{name: (optional(UNIX), None) for name in ("startedAt", "stepAt", "firstStepAt", "loadingAt", "sentAt",
                                                 "receivedAt")},
    "step": (optional(STEP), None), "firstStep": (optional(STEP), None),
    **{name: (optional(obj(MARK)), None) for name in ("saved", "loaded", "stopped")},
    "stalled": (flag, False), "previousPod": (text(253), ""),
}
READ_PROGRESS = lenient(obj(PROGRESS))
STOP: Shape = {"id": (text(32), REQUIRED), "step": (STEP, REQUIRED), "at": (UNIX, 0.0)}
ROUND: Shape = {
    "round": (integer(0, MAX_ROUND), REQUIRED), "nodes": (ip_list(MAX_NODES), list),
    "completedAt": (UNIX, REQUIRED), "formingSince": (optional(UNIX), None),
}
PACE: Shape = {"pod": (text(253, 1), REQUIRED), "seconds": (number(0, 3600, above=True), REQUIRED),
               "ranks": (integer(1, 1 << 20), REQUIRED)}
NODE_CHECK: Shape = {"addr": (text(64, 1), REQUIRED), "seconds": (seconds(7200), 0.0),
                     "held": (seconds(7200), REQUIRED), "at": (UNIX, REQUIRED)}
LINKS: Shape = {
    "round": (integer(0, MAX_ROUND), REQUIRED), "world": (integer(1, 1 << 16), REQUIRED),
    "seconds": (seconds(3600), REQUIRED), "outlier": (optional(ip), None), "reason": (optional(text(240)), None),
}
PEERS: Shape = {
    "checked": (flag, True), "told": (flag, False), "allowed": (ip_list(MAX_PEERS), list),
    "refused": (integer(0, MAX_COUNT), 0), "lastRefused": (ip_list(64), list), "held": (integer(0, MAX_COUNT), 0),
}
SEATS: Shape = {
    "count": (integer(1, 1 << 20), REQUIRED), "held": (ip_list(MAX_PEERS), list),
    "spares": (ip_list(MAX_PEERS), list), "joining": (ip_list(MAX_PEERS), list),
    "granted": (integer(0, MAX_COUNT), 0),
}
STATE: Shape = {
    "epoch": (hex_word, REQUIRED), "version": (integer(0, MAX_COUNT), 0), "runId": (text(256), ""),
    "now": (optional(UNIX), None), "minNodes": (integer(0, 1 << 20), 0), "maxNodes": (integer(0, 1 << 20), 0),
    "staleAfter": (optional(seconds(1e9)), None),
    "round": (optional(integer(0, MAX_ROUND)), None), "complete": (flag, False), "closed": (flag, False),
    "deadlineIn": (optional(number(-1e11, 1e11)), None),
    "participants": (listed(obj(NODE), MAX_NODES), list), "waiting": (listed(obj(NODE), MAX_NODES), list),
    "redundant": (listed(obj(NODE), MAX_NODES), list),
    "failureRounds": (integer(0, MAX_ROUND), 0), "lastFailureRoundAt": (optional(UNIX), None),
    "rounds": (listed(obj(ROUND), 64), list),  # the store keeps its last 10
    "waiterActive": (flag, False),
    "torch": (optional(obj(TORCH)), None),
    "progress": (READ_PROGRESS, None),  # the tenant's word, each part on its own
    "stop": (optional(obj(STOP)), None),
    "pace": (kept(obj(PACE), 256), list),
    "peers": (optional(obj(PEERS)), None),
    "nodeChecks": (kept(obj(NODE_CHECK), 256), list),
    "links": (lenient(obj(LINKS)), None),
    "seats": (optional(obj(SEATS)), None),
}
# Which shape reads which type: a unit test keeps each shape's fields the type's.
SHAPES: dict[str, tuple[type, Shape]] = {
    "state": (StateWire, STATE), "node": (NodeWire, NODE), "torch": (TorchWire, TORCH),
    "plainTorchrun": (PlainTorchrunWire, PLAIN), "mark": (MarkWire, MARK), "progress": (ProgressWire, PROGRESS),
    "stop": (StopWire, STOP), "round": (RoundWire, ROUND), "pace": (PaceWire, PACE),
    "nodeCheck": (NodeCheckWire, NODE_CHECK), "links": (LinksWire, LINKS), "peers": (PeersWire, PEERS),
    "seats": (SeatsWire, SEATS),
}


def read_state(body: Any) -> StateWire:
    """A decoded GET /v1/state reply, checked: every field of StateWire is there (a default where the reply has
    none). Raises Invalid for a reply that is not one."""
    return cast(StateWire, obj(STATE)("state", body))


def read_progress(body: Any) -> ProgressWire | None:
    """The training's report alone (the store's progress.describe), or None when it is none or not valid."""
    return cast(Optional[ProgressWire], READ_PROGRESS("progress", body))
