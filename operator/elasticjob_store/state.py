"""torch's rendezvous state as the c10d backend stores it, decoded without trusting the bytes.

The agents keep the whole rendezvous in one key, `torch.rendezvous.<run_id>`, as base64(pickle(_RendezvousState))
(torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py). Anyone who can reach the store's port can
write that key, so a plain `pickle.loads` here would run whatever they wrote inside the pod that holds the
control token. Decoding therefore (1) caps the size, (2) walks the opcodes without executing them
(pickle_walk.py), rejecting any opcode a real state does not use and bounding the work what they build would
take: opcodes, nesting (hashing a tuple nested a million deep overflows the C stack and kills the process),
the size it expands to through memo references, and keys that could share a hash (each insertion would then
compare with every key before it), (3) unpickles with only the five globals a real state needs,
and (4) checks the result's types and shape field by field. Whatever else goes wrong on the way (MemoryError,
RecursionError, a hostile object's own methods) is a StateError too, and no message quotes the bytes: the
store refuses, logs and polls again, four times a second.

The store decodes into stand-ins of torch's private classes (rdzv_classes.py) and writes them back under torch's
names, so it never imports torch; the agent's decoder (elasticjob_warm.statecheck) asks for torch's own classes
(`kinds=torch_kinds()`). compat.py checks at the store's start that this torch reads what the stand-ins write.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from elasticjob_store.pickle_walk import NODE_GLOBAL, StateError, check_structure
from elasticjob_store.rdzv_classes import RDZV_MODULE, STANDINS, Kinds, NodeDesc, RendezvousState, dumps, torch_kinds

__all__ = ["NodeDesc", "RendezvousState", "StateError", "NO_STATE", "Kinds", "torch_kinds", "state_key", "decode",
           "decode_as", "encode", "validate"]

# What the backend writes before the first real state ("no state yet"); see C10dRendezvousBackend.__init__.
NO_STATE = b"Y2FuaW1hZGFt"
# A real state is about 120 bytes of base64 per node; 1 MiB is thousands of nodes.
MAX_STATE_BYTES = 1 << 20
MAX_ADDR_CHARS = 255

# Found by pickling real states: nothing else is ever named. The agents pickle with Python's default protocol
# (4 since Python 3.8; 5 would name the same). Protocols 2 and 3 would also need builtins.set and the GLOBAL
# opcode; no agent writes them, so they are refused.
ALLOWED_GLOBALS = {
    (RDZV_MODULE, "_RendezvousState"): RendezvousState,
    NODE_GLOBAL: NodeDesc,  # the walk checks the kinds of its fields by this name
    ("datetime", "datetime"): datetime,
    ("datetime", "timezone"): timezone,
    ("datetime", "timedelta"): timedelta,
}


def _allowed(kinds: Kinds) -> dict[tuple[str, str], Any]:
    """ALLOWED_GLOBALS, torch's two names given the classes `kinds` names."""
    return {**ALLOWED_GLOBALS, (RDZV_MODULE, "_RendezvousState"): kinds.state, NODE_GLOBAL: kinds.node}


def state_key(run_id: str) -> str:
    # Not prefixed: the agents' backend talks to the raw store (C10dRendezvousBackend._key).
    return "torch.rendezvous." + run_id


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, kinds: Kinds = STANDINS) -> None:
        super().__init__(file)
        self._globals = _allowed(kinds)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._globals[(module, name)]
        except KeyError:
            raise StateError(f"pickle names {_global_name(module, name)}, which a rendezvous state never "
                             "contains") from None

    def persistent_load(self, pid: Any) -> Any:
        raise StateError("pickle uses persistent ids, which a rendezvous state never contains")


def _global_name(module: object, name: object) -> str:
    # What an attacker tried to run is worth a line in the log (the agents log it); the names are theirs, so
    # only a short dotted identifier is repeated, never arbitrary text.
    dotted = f"{module}.{name}" if type(module) is str and type(name) is str else ""
    if len(dotted) <= 100 and all(part.isascii() and part.isidentifier() for part in dotted.split(".")):
        return dotted
    return "a global"


def decode(raw: bytes) -> RendezvousState | None:
    """The state under the key, or None before the agents wrote one. Raises StateError for anything else."""
    return cast("RendezvousState | None", decode_as(raw, STANDINS))


def decode_as(raw: bytes, kinds: Kinds) -> Any:
    """decode(), the state made of `kinds`' classes (torch's own, for an agent)."""
    if not isinstance(raw, bytes):
        raise StateError(f"expected bytes, got {type(raw).__name__}")
    if raw in (b"", NO_STATE):
        return None
    if len(raw) > MAX_STATE_BYTES:
        raise StateError(f"state is {len(raw)} bytes, more than the {MAX_STATE_BYTES} this program reads")
    try:
        state = _load(raw, kinds)
    except StateError:
        raise
    except Exception as err:  # whatever else hostile bytes make the unpickler or hashing raise: refused the same
        raise StateError(f"state does not unpickle: {type(err).__name__}") from None
    validate(state, kinds)
    return state


def _load(raw: bytes, kinds: Kinds) -> object:
    try:
        data = base64.b64decode(raw, validate=True)
    except binascii.Error as err:
        raise StateError(f"state is not base64: {err}") from None  # binascii's words name no byte
    check_structure(data)
    return _StateUnpickler(io.BytesIO(data), kinds).load()


def encode(state: RendezvousState) -> bytes:
    """base64(pickle(state)) as the agents write it (default protocol, like their `pickle.dumps`), torch's class
    names in it."""
    validate(state)
    return base64.b64encode(dumps(state))


_STATE_FIELDS = {"round", "complete", "deadline", "closed", "participants", "wait_list", "redundancy_list",
                 "last_heartbeats"}
_NODE_FIELDS = {"addr", "pid", "local_id"}


def validate(state: object, kinds: Kinds = STANDINS) -> None:
    """Raises StateError unless `state` is a `kinds.state` with exactly the fields and types torch's
    _RendezvousState has.

    Its messages name types, never values: a value is the writer's, and the repr of one (a tuple of 10**10
    leaves by memo references) ran 67 s into MemoryError."""
    try:
        _check_state(state, kinds)
    except StateError:
        raise
    except Exception as err:  # a hostile object's own methods (hash, eq) failing: refused like the rest
        raise StateError(f"state fails its checks with {type(err).__name__}") from None


def _check_state(state: Any, kinds: Kinds) -> None:
    if type(state) is not kinds.state:
        raise StateError(f"state is {_a(state)}, not a _RendezvousState")
    fields = vars(state)
    _check_fields("state", fields, _STATE_FIELDS)
    if not _is_int(state.round) or state.round < 0:
        raise StateError(f"round is {_a(state.round)}, not a non-negative int")
    for name in ("complete", "closed"):
        if type(fields[name]) is not bool:
            raise StateError(f"{name} is {_a(fields[name])}, not a bool")
    if state.deadline is not None:
        _check_time("deadline", state.deadline)
    if type(state.participants) is not dict:
        raise StateError(f"participants is {_a(state.participants)}, not a dict")
    for node, rank in state.participants.items():
        _check_node(node, kinds)
        if not _is_int(rank) or rank < 0:
            raise StateError(f"a participant's rank is {_a(rank)}, not a non-negative int")
    for name in ("wait_list", "redundancy_list"):
        if type(fields[name]) is not set:
            raise StateError(f"{name} is not a set but {_a(fields[name])}")
        for node in fields[name]:
            _check_node(node, kinds)
    if type(state.last_heartbeats) is not dict:
        raise StateError(f"last_heartbeats is {_a(state.last_heartbeats)}, not a dict")
    for node, beat in state.last_heartbeats.items():
        _check_node(node, kinds)
        _check_time("a heartbeat", beat)


def _a(value: object) -> str:
    """What a value is, for a message: its type's name (the allowed globals' or a builtin's, never the
    writer's), and whether an int is negative."""
    if type(value) is int and value < 0:
        return "a negative int"
    name = type(value).__name__
    return f"{'an' if name[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} {name}"


def _check_fields(what: str, fields: dict[Any, Any], expected: set[str]) -> None:
    if fields.keys() != expected:
        missing = sorted(expected - fields.keys())
        unknown = len(fields.keys() - expected)
        raise StateError(f"{what} has other fields than torch's: missing {missing}, {unknown} unknown")


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass; a rank of True is not a state torch wrote


def _check_node(node: Any, kinds: Kinds) -> None:
    if type(node) is not kinds.node:
        raise StateError(f"node is {_a(node)}, not a _NodeDesc")
    _check_fields("node", vars(node), _NODE_FIELDS)
    if type(node.addr) is not str or not node.addr or len(node.addr) > MAX_ADDR_CHARS:
        raise StateError("node address is not a short non-empty string")
    if not _is_int(node.pid) or not _is_int(node.local_id) or node.pid < 0 or node.local_id < 0:
        raise StateError(f"a node's pid or local id is {_a(node.pid)} and {_a(node.local_id)}, not non-negative "
                         "ints")


def _check_time(what: str, value: object) -> None:
    # torch writes datetime.now(timezone.utc); a naive datetime would break its comparisons.
    if type(value) is not datetime:
        raise StateError(f"{what} is {_a(value)}, not a UTC datetime")
    if type(value.tzinfo) is not timezone:
        raise StateError(f"{what} is a datetime with {_a(value.tzinfo)} for its tzinfo, not a UTC datetime")
