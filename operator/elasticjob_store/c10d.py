"""The c10d TCPStore wire protocol as torch's own TCPStore client speaks it: the query numbers, the limits, and
how the protocol's values are read and written. Standard library only: the store's pod must not import torch.

Learnt from PyTorch's source (read, not copied) and checked against torch 2.13's own server, byte for byte, by
tests/unit/test_c10d_server.py:
  - torch/csrc/distributed/c10d/TCPStoreBackend.hpp as shipped with torch 2.13.0 (git cf30153c4c13): the query
    numbers, the validation magic number, the CHECK and WAIT reply codes.
  - torch/csrc/distributed/c10d/TCPStore.cpp (the client): pytorch/pytorch at 00321a02d719 for the framing, and
    the fork Khanaksahu/pytorch at 004ab03b0f0a for the handshake (VALIDATE, then PING), the queues and the key
    list. LIST_KEYS and BARRIER (TCPStore::listKeys, TCPStore::barrier, LibUVStoreDaemon::barrier) are newer than
    every pytorch/pytorch revision at hand: read in a third-party annotated copy of both files, then confirmed
    on torch 2.13's own server.
  - torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp (the server torch starts by default since 2.4):
    Khanaksahu/pytorch at 21bc649ae13e: how each query is parsed and answered, its limits.

The framing. A message is one byte, the query type, then its fields; no length covers the whole message.
Integers are in the host's byte order (torch copies them out of memory): little-endian on every usual host; a
client and a server of different orders fail with torch's own server too. A string (a key or a
value) is a uint64 length and that many bytes. A list of keys is a uint64 count and the keys. Torch's client
puts "/" before every key the caller names (not before "init/", its own worker counter); the server sees and
stores whole keys and never adds or strips the prefix.

The handshake. A connection's first message is VALIDATE with the uint32 0x3C85F7CE and gets no reply; torch
>= 2.4's client then PINGs with a uint32 nonce (its pid) and expects the same four bytes back.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Iterable
from typing import Protocol

MAGIC = 0x3C85F7CE

# Torch's own server refuses (and closes) a message past these; the same limits here mean every message torch's
# server takes is taken here, and no other.
MAX_KEY_BYTES = 8 * 1024  # MAX_STRING_LEN
MAX_VALUE_BYTES = 8 * 1024 * 1024  # MAX_PAYLOAD_LEN: torch's rendezvous state is far below it
MAX_REQUEST_KEYS = 128 * 1024  # MAX_KEY_COUNT, for CHECK, WAIT, MULTI_GET and MULTI_SET
# Ours alone: torch's limits allow one WAIT of 128 Ki keys of 8 KiB (1 GiB). No call torch makes comes near
# this (the largest is a MULTI_SET of a few values), and it bounds what one message can make the server buffer.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Query(enum.IntEnum):
    """The first byte of a message (the order of torch's QueryType enum is the protocol)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


# One-byte replies: CHECK answers READY or NOT_READY; WAIT and BARRIER answer STOP_WAITING when the keys are
# there, CANCEL_WAIT answers WAIT_CANCELED (a client that timed out may read a late STOP_WAITING first).
READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"

# Each query's fields, in order: u32, i64, a key, a value, keys (a count and keys), pairs (a count and keys,
# each followed by its value).
FIELDS: dict[Query, tuple[str, ...]] = {
    Query.VALIDATE: ("u32",),
    Query.SET: ("key", "value"),
    Query.COMPARE_SET: ("key", "value", "value"),
    Query.GET: ("key",),
    Query.ADD: ("key", "i64"),
    Query.CHECK: ("keys",),
    Query.WAIT: ("keys",),
    Query.GETNUMKEYS: (),
    Query.DELETE_KEY: ("key",),
    Query.APPEND: ("key", "value"),
    Query.MULTI_GET: ("keys",),
    Query.MULTI_SET: ("pairs",),
    Query.CANCEL_WAIT: (),
    Query.PING: ("u32",),
    Query.QUEUE_PUSH: ("key", "value"),
    Query.QUEUE_POP: ("key",),
    Query.QUEUE_LEN: ("key",),
    Query.LIST_KEYS: (),
    Query.BARRIER: ("key", "i64"),
}

_U32, _U64, _I64 = struct.Struct("=I"), struct.Struct("=Q"), struct.Struct("=q")
# What std::stoll accepts (the server's reading of a counter): C whitespace, a sign, digits, then anything.
_COUNTER = re.compile(rb"[ \t\n\x0b\x0c\r]*([+-]?[0-9]+)")


class Stream(Protocol):
    """What a message is read from: an asyncio.StreamReader."""

    async def readexactly(self, n: int) -> bytes: ...


class Malformed(ValueError):
    """The peer broke the protocol (or asked what torch's server refuses): its connection is closed."""


class Message:
    """Reads one message's fields off a stream, no more than MAX_MESSAGE_BYTES of them."""

    def __init__(self, stream: Stream, budget: int = MAX_MESSAGE_BYTES) -> None:
        self._stream = stream
        self._left = budget

    async def take(self, size: int) -> bytes:
        if size > self._left:
            raise Malformed(f"a message over {MAX_MESSAGE_BYTES} bytes")
        self._left -= size
        return await self._stream.readexactly(size)

    async def u32(self) -> int:
        return int(_U32.unpack(await self.take(4))[0])

    async def i64(self) -> int:
        return int(_I64.unpack(await self.take(8))[0])

    async def blob(self, limit: int, what: str) -> bytes:
        size = int(_U64.unpack(await self.take(8))[0])
        if size > limit:
            raise Malformed(f"a {what} of {size} bytes (at most {limit})")
        return await self.take(size)

    async def count(self) -> int:
        number = int(_U64.unpack(await self.take(8))[0])
        if number > MAX_REQUEST_KEYS:
            raise Malformed(f"{number} keys in one message (at most {MAX_REQUEST_KEYS})")
        return number

    async def field(self, kind: str) -> object:
        if kind == "u32":
            return await self.u32()
        if kind == "i64":
            return await self.i64()
        if kind == "key":
            return await self.blob(MAX_KEY_BYTES, "key")
        if kind == "value":
            return await self.blob(MAX_VALUE_BYTES, "value")
        if kind == "keys":
            return [await self.blob(MAX_KEY_BYTES, "key") for _ in range(await self.count())]
        if kind == "pairs":
            return [(await self.blob(MAX_KEY_BYTES, "key"), await self.blob(MAX_VALUE_BYTES, "value"))
                    for _ in range(await self.count())]
        raise AssertionError(kind)


async def read_query(stream: Stream) -> tuple[Query, list[object]]:
    """The next message: its type and its fields. asyncio.IncompleteReadError where the stream ends first (with
    nothing in `partial` where it ended between messages); Malformed for what torch's server would not take."""
    message = Message(stream)
    first = (await message.take(1))[0]
    try:
        query = Query(first)
    except ValueError:
        raise Malformed(f"unknown query type {first}") from None
    return query, [await message.field(kind) for kind in FIELDS[query]]


def u32(number: int) -> bytes:
    return _U32.pack(number)


def i64(number: int) -> bytes:
    return _I64.pack(number)


def blob(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def flag(ready: bool) -> bytes:
    return READY if ready else NOT_READY


def blobs(values: Iterable[bytes]) -> bytes:
    return b"".join(blob(value) for value in values)


def listing(keys: list[bytes]) -> bytes:
    """LIST_KEYS' answer: an int64 count, then the keys."""
    return i64(len(keys)) + blobs(keys)


def popped(item: tuple[int, bytes | None]) -> bytes:
    """QUEUE_POP's answer: the queue's int64 length before the pop, then the item where there was one."""
    length, value = item
    return i64(length) + (b"" if value is None else blob(value))


def counter(value: bytes) -> int:
    """A stored counter's number as the server reads it for ADD and BARRIER (std::stoll: leading whitespace, a
    sign, digits, and whatever follows ignored). Malformed where torch's server throws (and closes the adder)."""
    found = _COUNTER.match(value)
    if found is None:
        raise Malformed(f"ADD to a value that is not a number: {value[:32]!r}")
    number = int(found.group(1))
    if not INT64_MIN <= number <= INT64_MAX:
        raise Malformed(f"ADD to a number outside int64: {value[:32]!r}")
    return number


def wrap64(number: int) -> int:
    """A sum as int64 arithmetic leaves it: torch's server adds without an overflow check, and it wraps."""
    return (number - INT64_MIN) % 2**64 + INT64_MIN
