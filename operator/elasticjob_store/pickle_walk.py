"""The walk over a rendezvous state's pickle that runs before anything is unpickled: opcodes read, none run.

For each object the unpickler would build, the walk knows its kind, how deep it nests and its expanded size:
the objects it holds when every memo reference counts as a full copy, which is what hashing a key, comparing
or checking it costs. Three budgets bound the work whatever the bytes say: opcodes, depth, and the expanded
size of everything built. The last is the one the bytes cannot hint at: 1 KB of BINGETs make a tuple that
holds the same tuple 100 times, five levels down, 10**10 leaves (as a dict key, 10**9 of them were hashed for
8 s with the GIL held; the repr of 10**10 in an error message ran 67 s into MemoryError).

Sizes and depths are exact because an object, once placed in another, is never filled again. torch's pickler
fills every dict, set and instance while it sits on top of the stack, before it is placed; filling one after it
was placed is how nesting hides from a depth taken at placement (20,000 dicts each filled after its parent
took it) and how an object comes to hold itself, so it is refused.

The walk also refuses what could make many keys of one dict or set share a hash, for then each insertion
compares with every key before it: 7,000 nodes whose pids were k * (2**61 - 1), all of one hash, took 5.9 s.
A key or set member may be a str or bytes (SipHash, keyed per process: equal hashes cannot be crafted), an
int (32-bit only, so each has its own hash, but -1 and -2), None, a bool, or a _NodeDesc whose fields are
checked where BUILD sets them (see _NODE_FIELDS). Never a tuple, a datetime or the like: their hashes are
computed from ints alone, unseeded, so keys that collide can be searched for once and sent to every store.
"""

from __future__ import annotations

import pickletools
from typing import Any

# A real state takes about 25 opcodes per node: 200,000 is thousands of nodes.
MAX_OPCODES = 200_000
# A real state nests 9 deep (state -> dict -> heartbeats dict -> datetime -> tzinfo -> timedelta -> ...).
MAX_DEPTH = 32
# The expanded sizes of everything placed, summed: each object counts once per placement, with all it holds,
# so this bounds the work of hashing every key and checking every field, nesting included. Real states,
# measured (tests/unit/test_store_state_budget.py): about 140 per node, so 142,000 for 1,024 participants and
# 421,000 for the most a job can have (the schema's MAX_NODES, 1,024, in each of participants, wait_list and
# redundancy_list); a real-shaped state at MAX_OPCODES would be about 1.1 million. The budget is 7 times the
# largest real state and above anything real-shaped the opcode cap lets through, so for real states the byte
# and opcode caps stay the binding ones; what it refuses is references multiplying work. At the budget, the
# worst accepted (a key of 611 references to one tuple of 611) decodes in 4 ms.
MAX_EXPANDED = 3_000_000


class StateError(ValueError):
    """The bytes under the rendezvous key are not a state this program will touch."""


# The class whose instances are a state's keys; state.py allows it by the same name.
NODE_GLOBAL = ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_NodeDesc")
# What BUILD may set on a node, and the kind of each. torch's pickler writes a node as NEWOBJ with no arguments
# (object.__new__ ignores any: the class defines __init__), then BUILD with a dict of these fields; REDUCE
# would run __init__ with arguments the walk does not check, so it is refused for nodes. A node's hash is that
# of the tuple (addr, pid, local_id), and the address's hash is random, so nodes' hashes stay apart while pid
# and local_id are 32-bit ints. Ints of up to 63 bits are not enough: pid and local_id can be chosen so that
# they cancel through the tuple hash's rotation, whatever the address (measured: 2,000 nodes of one hash, for
# any address, in every process); that needs pids that differ by multiples of 2**33. An int address would make
# the whole hash the writer's to choose.
_NODE_FIELDS: dict[object, str] = {"addr": "str", "pid": "int", "local_id": "int"}

# Opcodes by their effect on the unpickler's stack. Together they are what protocols 4 and 5 produce for a
# real state, plus the wider forms of the same strings and bytes. Ints come only in the 32-bit forms: torch's
# ints are rounds, ranks, pids (at most 2**22 on Linux) and per-process counters, and the pickler writes LONG1
# only for ints outside 32 bits, where ints begin to share hashes (k * (2**61 - 1) all hash to 0). Each value
# is the kind of object the opcode pushes: the walk lets only dicts take items, only sets take members, only
# instances take BUILD, and only classes be called. BUILD on a class would set attributes on it (a crafted
# `_NodeDesc.__hash__ = None` breaks every later state until the process restarts).
_LEAVES = {"NONE": "constant", "NEWTRUE": "constant", "NEWFALSE": "constant", "BININT": "int", "BININT1": "int",
           "BININT2": "int", "SHORT_BINUNICODE": "str", "BINUNICODE": "str", "SHORT_BINBYTES": "bytes",
           "BINBYTES": "bytes", "EMPTY_TUPLE": "tuple", "EMPTY_DICT": "dict", "EMPTY_SET": "set"}
# What may be a dict's key or a set's member besides a node: kinds whose hashes no writer can make equal.
_KEY_KINDS = {"constant", "int", "str", "bytes"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_CALLS = {"REDUCE", "NEWOBJ"}  # pop a class and its argument tuple, push an instance
# The kind each fills, and how many it pops (None: down to the MARK).
_FILLS: dict[str, tuple[str, int | None]] = {"SETITEM": ("dict", 2), "SETITEMS": ("dict", None),
                                             "ADDITEMS": ("set", None), "BUILD": ("instance", 1)}
_NO_STACK = {"PROTO", "FRAME", "STOP"}
_MEMO_PUT = {"MEMOIZE", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"BINGET", "LONG_BINGET"}
_UNICODE = {"SHORT_BINUNICODE", "BINUNICODE"}  # their text is kept: class names and node fields


class _Obj:
    """What the walk knows of one object the unpickler would build; the stack and the memo share it, so what
    filling it adds is seen through every reference."""

    __slots__ = ("kind", "depth", "size", "placed", "value", "misfit")

    def __init__(self, kind: str, depth: int = 0, size: int = 1, value: object = None) -> None:
        self.kind, self.depth, self.size, self.placed = kind, depth, size, False
        # A str's text; a class's (module, name), and its instances' too, so that nodes are known by it.
        self.value = value
        # For a dict: why it cannot be a node's fields (one of its items is not one torch writes), or None.
        self.misfit: str | None = None


def check_structure(data: bytes) -> int:
    """Raises StateError unless the pickle's opcodes build only what a rendezvous state is made of, within the
    budgets; returns the expanded size of what they build."""
    walk = _Walk()
    try:
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if count >= MAX_OPCODES:
                raise StateError(f"more than {MAX_OPCODES} pickle opcodes")
            walk.step(op.name, arg)
    except StateError:
        raise
    except Exception as err:  # genops' own complaints about malformed input; they may quote it, so not kept
        raise StateError(f"malformed pickle ({type(err).__name__})") from None
    return walk.expanded


class _Walk:
    def __init__(self) -> None:
        self.stack: list[_Obj | None] = []
        self.memo: list[_Obj] = []
        self.expanded = 0  # the expanded sizes of everything placed so far

    def step(self, name: str, arg: Any) -> None:
        if name in _NO_STACK:
            return
        if name in _LEAVES:
            self._push(_Obj(_LEAVES[name], value=arg if name in _UNICODE else None))
        elif name == "MARK":
            self.stack.append(None)  # the walk's stack holds None where the unpickler's holds a MARK
        elif name == "STACK_GLOBAL":
            module, qualname = self._pop(2)
            self._place([module, qualname])
            self._push(_Obj("class", value=(module.value, qualname.value)))
        elif name in _TUPLES or name == "TUPLE":
            members = self._pop(_TUPLES[name]) if name in _TUPLES else self._pop_to_mark()
            self._push(self._built("tuple", members))
        elif name in _CALLS:
            callee, args = self._pop(2)
            _expect(callee, "class", name)
            _expect(args, "tuple", name)
            if callee.value == NODE_GLOBAL and name != "NEWOBJ":
                raise StateError("pickle makes a _NodeDesc by calling it, which torch's pickler never does")
            self._push(self._built("instance", [callee, args], value=callee.value))
        elif name in _FILLS:
            kind, count = _FILLS[name]
            members = self._pop_to_mark() if count is None else self._pop(count)
            target = _expect(self._top(), kind, name)
            self._fill(target, members)
            _check_filling(target, members)
        elif name in _MEMO_PUT:
            self._memo_put(len(self.memo) if name == "MEMOIZE" else arg)
        elif name in _MEMO_GET:
            self._push(self._memo_get(arg))
        else:
            raise StateError(f"pickle opcode {name} never appears in a rendezvous state")

    def _push(self, obj: _Obj) -> None:
        _check_depth(obj)
        self.stack.append(obj)

    def _built(self, kind: str, members: list[_Obj], value: object = None) -> _Obj:
        self._place(members)
        return _Obj(kind, 1 + _deepest(members), 1 + sum(member.size for member in members), value)

    def _fill(self, target: _Obj, members: list[_Obj]) -> None:
        self._place(members)  # first: a target among its own members is placed, and refused below
        if target.placed:
            raise StateError(f"pickle fills a {target.kind} after placing it in another object, which a "
                             "rendezvous state never does")
        target.depth = max(target.depth, 1 + _deepest(members))
        target.size += sum(member.size for member in members)
        _check_depth(target)

    def _place(self, members: list[_Obj]) -> None:
        for member in members:
            member.placed = True
            self.expanded += member.size
        if self.expanded > MAX_EXPANDED:
            raise StateError(f"pickle expands to more than {MAX_EXPANDED} objects (each reference to an object "
                             "counts all it holds)")

    def _memo_put(self, index: int) -> None:
        # The C unpickler grows its memo to twice the index it is given: LONG_BINPUT 2**27 in a 10-byte pickle
        # allocated 2 GiB. Picklers number entries densely, so an index past the next one is refused.
        if index > len(self.memo):
            raise StateError("pickle stores a memo entry beyond the next free one, which no pickler writes")
        obj = self._top()
        if index == len(self.memo):
            self.memo.append(obj)
        else:
            self.memo[index] = obj

    def _memo_get(self, index: int) -> _Obj:
        if index >= len(self.memo):
            raise StateError("pickle refers to a memo entry that was never stored")
        return self.memo[index]

    def _pop(self, n: int) -> list[_Obj]:
        items = [item for item in self.stack[-n:] if item is not None] if n <= len(self.stack) else []
        if len(items) < n:  # too few, or a MARK among them
            raise StateError("malformed pickle: stack underflow")
        del self.stack[-n:]
        return items

    def _pop_to_mark(self) -> list[_Obj]:
        """What lies above the MARK, in the order it was pushed."""
        items: list[_Obj] = []
        while self.stack:
            item = self.stack.pop()
            if item is None:  # the MARK
                return items[::-1]
            items.append(item)
        raise StateError("malformed pickle: no mark")

    def _top(self) -> _Obj:
        top = self.stack[-1] if self.stack else None
        if top is None:  # empty, or a MARK on top
            raise StateError("malformed pickle: stack underflow")
        return top


def _expect(obj: _Obj, kind: str, op: str) -> _Obj:
    if obj.kind != kind:
        raise StateError(f"pickle applies {op} to {_a(obj.kind)}, which a rendezvous state never does")
    return obj


def _deepest(members: list[_Obj]) -> int:
    return max((member.depth for member in members), default=0)


def _check_depth(obj: _Obj) -> None:
    if obj.depth > MAX_DEPTH:
        raise StateError(f"pickle nests deeper than {MAX_DEPTH} levels")


def _check_filling(target: _Obj, members: list[_Obj]) -> None:
    """Refuses keys that could share a hash, and node fields of other kinds than torch writes."""
    if target.kind == "set":
        _check_keys(members)
    elif target.kind == "dict":
        if len(members) % 2:
            raise StateError("malformed pickle: a key without a value")
        keys, values = members[0::2], members[1::2]
        _check_keys(keys)
        target.misfit = target.misfit or next(filter(None, map(_node_field_misfit, keys, values)), None)
    elif _is_node(target):
        fields = members[0]
        misfit = fields.misfit if fields.kind == "dict" else f"{_a(fields.kind)} for its fields"
        if misfit:
            raise StateError(f"pickle gives a _NodeDesc {misfit}, where torch writes a str addr and int pid and "
                             "local_id")


def _check_keys(keys: list[_Obj]) -> None:
    for key in keys:
        if key.kind not in _KEY_KINDS and not _is_node(key):
            raise StateError(f"pickle makes {_a(key.kind)} a dict key or set member, which a rendezvous state "
                             "never does")


def _is_node(obj: _Obj) -> bool:
    return obj.kind == "instance" and obj.value == NODE_GLOBAL


def _node_field_misfit(key: _Obj, value: _Obj) -> str | None:
    expected = _NODE_FIELDS.get(key.value) if key.kind == "str" else None
    if expected is None:
        return "a field other than addr, pid and local_id"
    if value.kind != expected:
        return f"{_a(value.kind)} {key.value}"  # the name is one of _NODE_FIELDS, not the writer's text
    return None


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
