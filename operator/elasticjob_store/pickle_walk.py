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


# Opcodes by their effect on the unpickler's stack. Together they are what protocols 4 and 5 produce for a
# real state, plus the wider forms of the same ints, strings and bytes. Each value is the kind of object the
# opcode pushes: the walk lets only dicts take items, only sets take members, only instances take BUILD, and
# only classes be called. BUILD on a class would set attributes on it (a crafted `_NodeDesc.__hash__ = None`
# breaks every later state until the process restarts).
_LEAVES = {"NONE": "leaf", "NEWTRUE": "leaf", "NEWFALSE": "leaf", "BININT": "leaf", "BININT1": "leaf",
           "BININT2": "leaf", "LONG1": "leaf", "SHORT_BINUNICODE": "leaf", "BINUNICODE": "leaf",
           "SHORT_BINBYTES": "leaf", "BINBYTES": "leaf", "EMPTY_TUPLE": "tuple", "EMPTY_DICT": "dict",
           "EMPTY_SET": "set"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_CALLS = {"REDUCE", "NEWOBJ"}  # pop a class and its argument tuple, push an instance
# The kind each fills, and how many it pops (None: down to the MARK).
_FILLS: dict[str, tuple[str, int | None]] = {"SETITEM": ("dict", 2), "SETITEMS": ("dict", None),
                                             "ADDITEMS": ("set", None), "BUILD": ("instance", 1)}
_NO_STACK = {"PROTO", "FRAME", "STOP"}
_MEMO_PUT = {"MEMOIZE", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"BINGET", "LONG_BINGET"}


class _Obj:
    """What the walk knows of one object the unpickler would build; the stack and the memo share it, so what
    filling it adds is seen through every reference."""

    __slots__ = ("kind", "depth", "size", "placed")

    def __init__(self, kind: str, depth: int = 0, size: int = 1) -> None:
        self.kind, self.depth, self.size, self.placed = kind, depth, size, False


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
            self._push(_Obj(_LEAVES[name]))
        elif name == "MARK":
            self.stack.append(None)  # the walk's stack holds None where the unpickler's holds a MARK
        elif name == "STACK_GLOBAL":
            self._place(self._pop(2))
            self._push(_Obj("class"))
        elif name in _TUPLES or name == "TUPLE":
            members = self._pop(_TUPLES[name]) if name in _TUPLES else self._pop_to_mark()
            self._push(self._built("tuple", members))
        elif name in _CALLS:
            callee, args = self._pop(2)
            _expect(callee, "class", name)
            _expect(args, "tuple", name)
            self._push(self._built("instance", [callee, args]))
        elif name in _FILLS:
            kind, count = _FILLS[name]
            members = self._pop_to_mark() if count is None else self._pop(count)
            self._fill(_expect(self._top(), kind, name), members)
        elif name in _MEMO_PUT:
            self._memo_put(len(self.memo) if name == "MEMOIZE" else arg)
        elif name in _MEMO_GET:
            self._push(self._memo_get(arg))
        else:
            raise StateError(f"pickle opcode {name} never appears in a rendezvous state")

    def _push(self, obj: _Obj) -> None:
        _check_depth(obj)
        self.stack.append(obj)

    def _built(self, kind: str, members: list[_Obj]) -> _Obj:
        self._place(members)
        return _Obj(kind, 1 + _deepest(members), 1 + sum(member.size for member in members))

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
        items: list[_Obj] = []
        while self.stack:
            item = self.stack.pop()
            if item is None:  # the MARK
                return items
            items.append(item)
        raise StateError("malformed pickle: no mark")

    def _top(self) -> _Obj:
        top = self.stack[-1] if self.stack else None
        if top is None:  # empty, or a MARK on top
            raise StateError("malformed pickle: stack underflow")
        return top


def _expect(obj: _Obj, kind: str, op: str) -> _Obj:
    if obj.kind != kind:
        raise StateError(f"pickle applies {op} to a {obj.kind}, which a rendezvous state never does")
    return obj


def _deepest(members: list[_Obj]) -> int:
    return max((member.depth for member in members), default=0)


def _check_depth(obj: _Obj) -> None:
    if obj.depth > MAX_DEPTH:
        raise StateError(f"pickle nests deeper than {MAX_DEPTH} levels")
