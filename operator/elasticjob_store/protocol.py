"""The store's control protocol, written once: its port, its paths, and each request and reply as a type.

Both sides use this module. The store (server.py) checks a request body into its type and writes its reply
from one; the operator's planner builds requests as types, its client (elasticjob.rendezvous_client) sends
them and reads the replies back into types. So this module imports the standard library only, and no other
module of this package but its checks: with protocol_state.py (GET /v1/state's reply, written the same way), it
is what the operator imports of the store (the contracts in pyproject.toml allow those imports;
test_store_protocol checks what importing them pulls in). Python 3.10, as the store.

    GET  /healthz                         no token: the liveness probe
    GET  /v1/state?after=N&epoch=E&wait=S StateQuery -> StateWire (protocol_state.py: the store writes it,
                                          the operator reads it back with read_state)
    POST /v1/remove                       Remove   -> RemoveReply
    POST /v1/complete                     Complete -> CompleteReply
    POST /v1/hold                         Hold     -> HoldReply (the first round waits for workers starting)
    POST /v1/restart                      Restart  -> RestartReply
    POST /v1/stop                         Stop     -> StopReply (a planned stop: the training saves at a step)
    POST /v1/reopen                       Reopen   -> RestartReply (a closed round the job did not close)
    POST /v1/peers                        Peers    -> PeersReply (the job's pods: the only peers the store's
                                          port answers, gate.py)
    POST /v1/seats                        Seats    -> ActionReply (how many agents may be in the rounds of a
                                          job with spares, seats.py)
    any refusal                           ErrorReply, with a status other than 200

Request bodies are checked strictly (a field the store does not know is refused: a nudge must not be taken
for another). Replies are read leniently about what they add: a field this side does not know is skipped, so
a store may grow its replies (and an operator read an older store's) without a step in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

# The checks on a request's fields, in a module of their own that imports nothing of ours either.
from elasticjob_store.protocol_checks import (
    MAX_INT,
    Query,
    addresses,
    fields,
    integer,
    ip,
    optional,
    query_float,
    query_int,
    seconds,
    unix_time,
)

# Re-exported: both sides catch Invalid here, and the operator reads MAX_PEERS here.
from elasticjob_store.protocol_checks import MAX_PEERS as MAX_PEERS  # noqa: F401
from elasticjob_store.protocol_checks import REQUIRED as _REQUIRED
from elasticjob_store.protocol_checks import Invalid as Invalid
from elasticjob_store.protocol_checks import reply_field as _get

# The longest a GET /v1/state?wait= holds its answer back (the operator asks for less, and times out later).
MAX_WAIT = 60.0
HEALTHZ = "/healthz"
STATE = "/v1/state"

def control_port(store_port: int) -> int:
    """The control endpoint's port: the one after the c10d store's (spec.rendezvous.port)."""
    return store_port + 1


# The state's long-poll.

@dataclass(frozen=True)
class StateQuery:
    """GET /v1/state, answered at once; with `wait`, held until the summary's version passes `after`, or at
    once when the store's epoch is not `epoch` (it restarted: its versions started over), or for `wait`
    seconds at most."""

    after: int = -1
    epoch: str | None = None  # None: whichever epoch the store is in
    wait: float = 0.0

    def path(self) -> str:
        if not self.wait:
            return STATE
        return f"{STATE}?after={self.after}&epoch={self.epoch or ''}&wait={self.wait:g}"

    def holds(self, epoch: str) -> bool:
        """Whether a store in `epoch` holds the answer back (until its version passes `after`)."""
        return self.wait > 0 and self.epoch in (None, epoch)

    @classmethod
    def from_query(cls, query: Query) -> StateQuery:
        epoch = query.get("epoch", [None])[0]  # parse_qs leaves out a blank epoch=: any epoch, as none
        return cls(query_int(query, "after", -1), epoch, query_float(query, "wait", 0.0, MAX_WAIT))


# Replies: read leniently (fields added later are skipped), each known field checked for its type.

@dataclass(frozen=True)
class NodeRef:
    """An agent as torch names it: the address it rendezvoused with, its pid and its local id."""

    addr: str
    pid: int
    local_id: int

    def to_wire(self) -> dict[str, Any]:
        return {"addr": self.addr, "pid": self.pid, "localId": self.local_id}

    @classmethod
    def from_wire(cls, body: Any) -> NodeRef:
        return cls(_get(body, "addr", (str,), _REQUIRED), _get(body, "pid", (int,), _REQUIRED),
                   _get(body, "localId", (int,), _REQUIRED))


@dataclass(frozen=True)
class ActionReply:
    """What every action answers: whether the store changed the rendezvous (a repeat finds it done and says
    False) and why; `refused` when the action would have been unsafe, not merely unneeded."""

    changed: bool
    reason: str = ""
    refused: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"changed": self.changed, "reason": self.reason}

    @staticmethod
    def _common(body: Any) -> tuple[bool, str]:
        return _get(body, "changed", (bool,), _REQUIRED), _get(body, "reason", (str,), "")


@dataclass(frozen=True)
class RemoveReply(ActionReply):
    removed: tuple[NodeRef, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"removed": [node.to_wire() for node in self.removed], **super().to_wire(), "refused": self.refused}

    @classmethod
    def from_wire(cls, body: Any) -> RemoveReply:
        changed, reason = cls._common(body)
        removed = _get(body, "removed", (list,), [])
        return cls(changed, reason, _get(body, "refused", (str, type(None)), None),
                   tuple(NodeRef.from_wire(node) for node in removed))


@dataclass(frozen=True)
class CompleteReply(ActionReply):
    completed: bool = False  # the round completes (or had completed) at the agents' next poll

    def to_wire(self) -> dict[str, Any]:
        return {"completed": self.completed, **super().to_wire()}

    @classmethod
    def from_wire(cls, body: Any) -> CompleteReply:
        changed, reason = cls._common(body)
        return cls(changed, reason, completed=_get(body, "completed", (bool,), False))


@dataclass(frozen=True)
class HoldReply(ActionReply):
    held_until: float | None = None  # unix seconds: the round's last call ends no earlier (None: not held)

    def to_wire(self) -> dict[str, Any]:
        return {"heldUntil": self.held_until, **super().to_wire()}

    @classmethod
    def from_wire(cls, body: Any) -> HoldReply:
        changed, reason = cls._common(body)
        return cls(changed, reason, held_until=_get(body, "heldUntil", (float, int, type(None)), None))


@dataclass(frozen=True)
class RestartReply(ActionReply):
    restarting: bool = False  # the round's agents restart their workers (or were already doing so)

    def to_wire(self) -> dict[str, Any]:
        return {"restarting": self.restarting, **super().to_wire()}

    @classmethod
    def from_wire(cls, body: Any) -> RestartReply:
        changed, reason = cls._common(body)
        return cls(changed, reason, restarting=_get(body, "restarting", (bool,), False))


@dataclass(frozen=True)
class StopReply(ActionReply):
    step: int | None = None  # the step every rank stops after (None: no stop could be agreed yet)

    def to_wire(self) -> dict[str, Any]:
        return {"step": self.step, **super().to_wire()}

    @classmethod
    def from_wire(cls, body: Any) -> StopReply:
        changed, reason = cls._common(body)
        return cls(changed, reason, step=_get(body, "step", (int, type(None)), None))


@dataclass(frozen=True)
class ErrorReply:
    """The body of every answer but 200: a bad request, a missing token, a state the store refuses to read."""

    error: str

    def to_wire(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def from_wire(cls, body: Any) -> ErrorReply:
        return cls(_get(body, "error", (str,), _REQUIRED))


# Requests: checked strictly, every field required and none other allowed.

@dataclass(frozen=True)
class Remove:
    """Take out every agent at `addr` whose last heartbeat is older than `heartbeat_before` (unix seconds): a
    replacement pod that reused the address heartbeats after it."""

    KIND: ClassVar[str] = "remove"
    addr: str
    heartbeat_before: float

    def to_wire(self) -> dict[str, Any]:
        return {"addr": self.addr, "heartbeatBefore": self.heartbeat_before}

    @classmethod
    def from_wire(cls, body: Any) -> Remove:
        args = fields(body, {"addr": ip, "heartbeatBefore": unix_time})
        return cls(args["addr"], args["heartbeatBefore"])

    @staticmethod
    def reply(body: Any) -> RemoveReply:
        return RemoveReply.from_wire(body)


@dataclass(frozen=True)
class Complete:
    """End the last call now: `live_nodes` agents are every live one, and all have joined."""

    KIND: ClassVar[str] = "complete"
    live_nodes: int

    def to_wire(self) -> dict[str, Any]:
        return {"liveNodes": self.live_nodes}

    @classmethod
    def from_wire(cls, body: Any) -> Complete:
        return cls(fields(body, {"liveNodes": integer(1, MAX_INT)})["liveNodes"])

    @staticmethod
    def reply(body: Any) -> CompleteReply:
        return CompleteReply.from_wire(body)


# The longest the store keeps a round's last call open for workers still starting, from its first hold of it.
MAX_HOLD = 30.0


@dataclass(frozen=True)
class Hold:
    """Keep round `round`'s last call open up to `seconds` after the store's first hold of that round (never past
    MAX_HOLD): more of the job's workers are starting, and one joining after the round formed would restart the
    whole group at once. Complete ends it early, once every live worker joined."""

    KIND: ClassVar[str] = "hold"
    round: int
    seconds: float

    def to_wire(self) -> dict[str, Any]:
        return {"round": self.round, "seconds": self.seconds}

    @classmethod
    def from_wire(cls, body: Any) -> Hold:
        args = fields(body, {"round": integer(0, MAX_INT), "seconds": seconds(MAX_HOLD)})
        return cls(args["round"], args["seconds"])

    @staticmethod
    def reply(body: Any) -> HoldReply:
        return HoldReply.from_wire(body)


@dataclass(frozen=True)
class Restart:
    """Make the agents of `round` restart their workers (fenced: another round is left alone)."""

    KIND: ClassVar[str] = "restart"
    round: int

    def to_wire(self) -> dict[str, Any]:
        return {"round": self.round}

    @classmethod
    def from_wire(cls, body: Any) -> Restart:
        return cls(fields(body, {"round": integer(0, MAX_INT)})["round"])

    @staticmethod
    def reply(body: Any) -> RestartReply:
        return RestartReply.from_wire(body)


MAX_STOP_MARGIN = 60.0


@dataclass(frozen=True)
class Stop:
    """A planned stop: every rank of the training stops after one step, the store's pick, saves and says so
    (elasticjob_progress's should_stop and stopped). `requested_at` (the operator's unix seconds when it
    decided) names the stop: asked again, the store answers with the step it picked the first time.
    `margin_seconds` is how long, past the training's latest report, every rank may need to learn the step."""

    KIND: ClassVar[str] = "stop"
    requested_at: float
    margin_seconds: float

    def to_wire(self) -> dict[str, Any]:
        return {"requestedAt": self.requested_at, "marginSeconds": self.margin_seconds}

    @classmethod
    def from_wire(cls, body: Any) -> Stop:
        args = fields(body, {"requestedAt": unix_time, "marginSeconds": seconds(MAX_STOP_MARGIN)})
        return cls(args["requestedAt"], args["marginSeconds"])

    @staticmethod
    def reply(body: Any) -> StopReply:
        return StopReply.from_wire(body)


@dataclass(frozen=True)
class Reopen:
    """`round` is closed while the job trains (an agent left on it, no worker failed or finished): write an open
    round after it (fenced: another round is left alone)."""

    KIND: ClassVar[str] = "reopen"
    round: int

    def to_wire(self) -> dict[str, Any]:
        return {"round": self.round}

    @classmethod
    def from_wire(cls, body: Any) -> Reopen:
        return cls(fields(body, {"round": integer(0, MAX_INT)})["round"])

    @staticmethod
    def reply(body: Any) -> RestartReply:
        return RestartReply.from_wire(body)


@dataclass(frozen=True)
class PeersReply(ActionReply):
    allowed: int = 0  # how many addresses the gate lets through now

    def to_wire(self) -> dict[str, Any]:
        return {"allowed": self.allowed, **super().to_wire()}

    @classmethod
    def from_wire(cls, body: Any) -> PeersReply:
        changed, reason = cls._common(body)
        return cls(changed, reason, allowed=_get(body, "allowed", (int,), 0))


@dataclass(frozen=True)
class Peers:
    """The job's pods are at `addresses` (every worker pod with an IP, until it is gone): the store's port
    answers them and its own loopback, and closes every other peer (gate.py). Sent whole each time."""

    KIND: ClassVar[str] = "peers"
    addresses: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"addresses": list(self.addresses)}

    @classmethod
    def from_wire(cls, body: Any) -> Peers:
        return cls(fields(body, {"addresses": addresses})["addresses"])

    @staticmethod
    def reply(body: Any) -> PeersReply:
        return PeersReply.from_wire(body)


@dataclass(frozen=True)
class Seats:
    """A job with spares: `count` of its agents may be in its rounds (its replicas); None: every agent."""

    KIND: ClassVar[str] = "seats"
    count: int | None

    def to_wire(self) -> dict[str, Any]:
        return {"count": self.count}

    @classmethod
    def from_wire(cls, body: Any) -> Seats:
        return cls(fields(body, {"count": optional(integer(1, MAX_INT))})["count"])

    @staticmethod
    def reply(body: Any) -> ActionReply:
        changed, reason = ActionReply._common(body)
        return ActionReply(changed, reason)


Request = Union[Remove, Complete, Hold, Restart, Stop, Peers, Reopen, Seats]  # not `|`: the store runs on 3.9 too
REQUESTS: tuple[type[Remove] | type[Complete] | type[Hold] | type[Restart] | type[Stop] | type[Peers] | type[Reopen]
                | type[Seats], ...] = (Remove, Complete, Hold, Restart, Stop, Peers, Reopen, Seats)


def path(request: Request | type[Request]) -> str:
    return f"/v1/{request.KIND}"


ACTIONS = tuple(path(kind) for kind in REQUESTS)
