"""torch's rendezvous state as the c10d backend stores it, decoded without trusting the bytes.

The agents keep the whole rendezvous in one key, `torch.rendezvous.<run_id>`, as base64(pickle(_RendezvousState))
(torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py). Anyone who can reach the store's port can
write that key, so a plain `pickle.loads` here would run whatever they wrote inside the pod that holds the
control token. Decoding therefore (1) caps the size, (2) walks the opcodes without executing them, rejecting
any opcode a real state does not use and any structure nested deeper than a real state (hashing a tuple nested
a million deep overflows the C stack and kills the process), (3) unpickles with only the five globals a real
state needs, and (4) checks the result's types and shape field by field.

The classes are torch's private ones: this module must run the agents' exact torch version, which it does
because the rendezvous pod runs the worker image.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import pickletools
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc as NodeDesc
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState as RendezvousState

__all__ = ["NodeDesc", "RendezvousState", "StateError", "NO_STATE", "state_key", "decode", "encode", "validate"]

# What the backend writes before the first real state ("no state yet"); see C10dRendezvousBackend.__init__.
NO_STATE = b"Y2FuaW1hZGFt"
# A real state is about 120 bytes of base64 per node; 1 MiB is thousands of nodes.
MAX_STATE_BYTES = 1 << 20
MAX_OPCODES = 200_000
# A real state nests 9 deep (state -> dict -> heartbeats dict -> datetime -> tzinfo -> timedelta -> ...).
MAX_DEPTH = 32
MAX_ADDR_CHARS = 255

_RDZV_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
# Found by pickling real states: nothing else is ever named. The agents pickle with Python's default protocol
# (4 since Python 3.8; 5 would name the same). Protocols 2 and 3 would also need builtins.set and the GLOBAL
# opcode; no agent writes them, so they are refused.
ALLOWED_GLOBALS = {
    (_RDZV_MODULE, "_RendezvousState"): RendezvousState,
    (_RDZV_MODULE, "_NodeDesc"): NodeDesc,
    ("datetime", "datetime"): datetime,
    ("datetime", "timezone"): timezone,
    ("datetime", "timedelta"): timedelta,
}

# Opcodes by their effect on the unpickler's stack, for the structural walk below. Together they are what
# protocols 4 and 5 produce for a real state, plus the wider forms of the same ints, strings and bytes.
# Each value is the kind of object the opcode pushes: the walk lets only dicts take items, only sets take
# members, only instances take BUILD, and only classes be called. BUILD on a class would set attributes on
# it (a crafted `_NodeDesc.__hash__ = None` breaks every later state until the process restarts).
_LEAVES = {"NONE": "leaf", "NEWTRUE": "leaf", "NEWFALSE": "leaf", "BININT": "leaf", "BININT1": "leaf",
           "BININT2": "leaf", "LONG1": "leaf", "SHORT_BINUNICODE": "leaf", "BINUNICODE": "leaf",
           "SHORT_BINBYTES": "leaf", "BINBYTES": "leaf", "EMPTY_TUPLE": "tuple", "EMPTY_DICT": "dict",
           "EMPTY_SET": "set"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_CALLS = {"REDUCE", "NEWOBJ"}  # pop a class and its argument tuple, push an instance
_NO_STACK = {"PROTO", "FRAME", "STOP"}
_MEMO_PUT = {"MEMOIZE", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"BINGET", "LONG_BINGET"}
_MARK = object()


class StateError(ValueError):
    """The bytes under the rendezvous key are not a state this program will touch."""


def state_key(run_id: str) -> str:
    # Not prefixed: the agents' backend talks to the raw store (C10dRendezvousBackend._key).
    return "torch.rendezvous." + run_id


def _check_structure(data: bytes) -> None:
    """Walks the pickle's opcodes (no code runs) tracking what each object is and how deep it nests.

    Each stack entry is a [depth, kind] list shared with the memo, so filling an object after it was memoised
    (dicts are memoised empty, then filled) raises the depth seen through every reference to it, and a class
    fetched back from the memo is still a class.
    """
    stack: list[Any] = []
    memo: dict[int, list[Any]] = {}
    try:
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if count >= MAX_OPCODES:
                raise StateError(f"more than {MAX_OPCODES} pickle opcodes")
            _step(op.name, arg, stack, memo)
            if stack and stack[-1] is not _MARK and stack[-1][0] > MAX_DEPTH:
                raise StateError(f"pickle nests deeper than {MAX_DEPTH} levels")
    except StateError:
        raise
    except Exception as err:  # genops' own complaints about malformed input
        raise StateError(f"malformed pickle: {err}") from None


def _step(name: str, arg: Any, stack: list[Any], memo: dict[int, list[Any]]) -> None:
    if name in _NO_STACK:
        return
    if name in _LEAVES:
        stack.append([0, _LEAVES[name]])
    elif name == "MARK":
        stack.append(_MARK)
    elif name == "STACK_GLOBAL":
        _pop(stack, 2)
        stack.append([0, "class"])
    elif name in _TUPLES:
        stack.append([1 + _deepest(_pop(stack, _TUPLES[name])), "tuple"])
    elif name == "TUPLE":
        stack.append([1 + _deepest(_pop_to_mark(stack)), "tuple"])
    elif name in _CALLS:
        callee, args = _pop(stack, 2)
        _expect(callee, "class", name)
        _expect(args, "tuple", name)
        stack.append([1 + args[0], "instance"])
    elif name == "SETITEM":
        items = _pop(stack, 2)
        _fill(_expect(_top(stack, 0), "dict", name), items)
    elif name == "BUILD":
        items = _pop(stack, 1)
        _fill(_expect(_top(stack, 0), "instance", name), items)
    elif name in ("SETITEMS", "ADDITEMS"):
        items = _pop_to_mark(stack)
        _fill(_expect(_top(stack, 0), "dict" if name == "SETITEMS" else "set", name), items)
    elif name in _MEMO_PUT:
        memo[len(memo) if name == "MEMOIZE" else arg] = _top(stack, 0)
    elif name in _MEMO_GET:
        if arg not in memo:
            raise StateError(f"pickle refers to memo entry {arg} that was never stored")
        stack.append(memo[arg])
    else:
        raise StateError(f"pickle opcode {name} never appears in a rendezvous state")


def _expect(entry: list[Any], kind: str, op: str) -> list[Any]:
    if entry[1] != kind:
        raise StateError(f"pickle applies {op} to a {entry[1]}, which a rendezvous state never does")
    return entry


def _pop(stack: list[Any], n: int) -> list[Any]:
    if len(stack) < n or any(item is _MARK for item in stack[len(stack) - n:]):
        raise StateError("malformed pickle: stack underflow")
    items = stack[len(stack) - n:]
    del stack[len(stack) - n:]
    return items


def _pop_to_mark(stack: list[Any]) -> list[Any]:
    items = []
    while stack and stack[-1] is not _MARK:
        items.append(stack.pop())
    if not stack:
        raise StateError("malformed pickle: no mark")
    stack.pop()
    return items


def _top(stack: list[Any], below: int) -> list[Any]:
    # The object `below` entries under the top (before they are popped).
    if len(stack) <= below or stack[-1 - below] is _MARK:
        raise StateError("malformed pickle: stack underflow")
    top: list[Any] = stack[-1 - below]
    return top


def _deepest(items: list[Any]) -> int:
    return max((item[0] for item in items), default=0)


def _fill(target: list[Any], items: list[Any]) -> None:
    target[0] = max(target[0], 1 + _deepest(items))


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise StateError(f"pickle names {module}.{name}, which a rendezvous state never contains") from None

    def persistent_load(self, pid: Any) -> Any:
        raise StateError("pickle uses persistent ids, which a rendezvous state never contains")


def decode(raw: bytes) -> RendezvousState | None:
    """The state under the key, or None before the agents wrote one. Raises StateError for anything else."""
    if not isinstance(raw, bytes):
        raise StateError(f"expected bytes, got {type(raw).__name__}")
    if raw in (b"", NO_STATE):
        return None
    if len(raw) > MAX_STATE_BYTES:
        raise StateError(f"state is {len(raw)} bytes, more than the {MAX_STATE_BYTES} this program reads")
    try:
        data = base64.b64decode(raw, validate=True)
    except binascii.Error as err:
        raise StateError(f"state is not base64: {err}") from None
    _check_structure(data)
    try:
        state = _StateUnpickler(io.BytesIO(data)).load()
    except StateError:
        raise
    except Exception as err:  # anything the allowed constructors or hashing raise on hostile arguments
        raise StateError(f"state does not unpickle: {type(err).__name__}: {err}") from None
    validate(state)
    return cast(RendezvousState, state)


def encode(state: RendezvousState) -> bytes:
    """base64(pickle(state)) as the agents write it (default protocol, like their `pickle.dumps`)."""
    validate(state)
    return base64.b64encode(pickle.dumps(state))


_STATE_FIELDS = {"round", "complete", "deadline", "closed", "participants", "wait_list", "redundancy_list",
                 "last_heartbeats"}
_NODE_FIELDS = {"addr", "pid", "local_id"}


def validate(state: object) -> None:
    """Raises StateError unless `state` has exactly the fields and types torch's _RendezvousState has."""
    if type(state) is not RendezvousState:
        raise StateError(f"state is a {type(state).__name__}, not a _RendezvousState")
    fields = vars(state)
    if set(fields) != _STATE_FIELDS:
        raise StateError(f"state has fields {sorted(fields)}, expected {sorted(_STATE_FIELDS)}")
    if not _is_int(state.round) or state.round < 0:
        raise StateError(f"round is {state.round!r}, not a non-negative int")
    for name in ("complete", "closed"):
        if type(fields[name]) is not bool:
            raise StateError(f"{name} is {fields[name]!r}, not a bool")
    if state.deadline is not None:
        _check_time("deadline", state.deadline)
    if type(state.participants) is not dict:
        raise StateError("participants is not a dict")
    for node, rank in state.participants.items():
        _check_node(node)
        if not _is_int(rank) or rank < 0:
            raise StateError(f"rank of {node!r} is {rank!r}, not a non-negative int")
    for name in ("wait_list", "redundancy_list"):
        if type(fields[name]) is not set:
            raise StateError(f"{name} is not a set")
        for node in fields[name]:
            _check_node(node)
    if type(state.last_heartbeats) is not dict:
        raise StateError("last_heartbeats is not a dict")
    for node, beat in state.last_heartbeats.items():
        _check_node(node)
        _check_time(f"heartbeat of {node!r}", beat)


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass; a rank of True is not a state torch wrote


def _check_node(node: object) -> None:
    if type(node) is not NodeDesc:
        raise StateError(f"node is a {type(node).__name__}, not a _NodeDesc")
    fields = vars(node)
    if set(fields) != _NODE_FIELDS:
        raise StateError(f"node has fields {sorted(fields)}, expected {sorted(_NODE_FIELDS)}")
    if type(node.addr) is not str or not node.addr or len(node.addr) > MAX_ADDR_CHARS:
        raise StateError("node address is not a short non-empty string")
    if not _is_int(node.pid) or not _is_int(node.local_id):
        raise StateError(f"node {node.addr} has a pid or local id that is not an int")


def _check_time(what: str, value: object) -> None:
    # torch writes datetime.now(timezone.utc); a naive datetime would break its comparisons.
    if type(value) is not datetime or type(value.tzinfo) is not timezone:
        raise StateError(f"{what} is {value!r}, not a UTC datetime")
