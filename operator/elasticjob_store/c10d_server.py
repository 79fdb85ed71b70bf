"""A c10d TCPStore server in pure Python, so that the store's pod need not import torch (2-6 s on a loaded node)
to host one: torch's own client (torch.distributed.TCPStore(host, port, is_master=False)) talks to it as it
talks to torch's server. The wire protocol is in c10d.py; this module holds the keys and answers.

One asyncio loop, on a thread of its own, owns the keys, the queues and the waiters. Each client is a coroutine
that reads a message, answers it and reads the next. A WAIT (or BARRIER) not answerable yet leaves the client
registered as a waiter and its coroutine reads on: torch's client sends nothing more but a CANCEL_WAIT once its
own timeout has passed. The store's own threads use LocalStore: each call runs on the loop, no socket between.

Where this server differs from torch's, on purpose:
  - a client whose first message is not VALIDATE with the magic number is closed (torch's leaves it unanswered);
  - COMPARE_SET on a missing key with a non-empty expected value wakes no waiter (torch's wakes the key's
    waiters though the key is still missing; their GET then reads an empty value);
  - the store as a whole is bounded (MAX_KEYS, MAX_STORED_BYTES): a write past either closes its writer and the
    store lives on (torch's grows until the pod is killed for its memory, losing every agent);
  - a second WAIT while one is pending closes the client (torch's client never sends one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, Union

from elasticjob_store import c10d, peers
from elasticjob_store.c10d import STOP_WAITING, Query
from elasticjob_store.c10d_table import MAX_KEYS, MAX_STORED_BYTES, StoreFull, Table, Waiter

T = TypeVar("T")
Accept = Callable[[str], Awaitable[bool]]
Value = Union[bytes, str]

# As torch's server: many agents dial at once when a job starts (the kernel caps it at somaxconn).
BACKLOG = 16384
# How long a LocalStore call, or stop(), waits for the loop.
CALL_TIMEOUT = 30.0
# torch's client's default timeout, and so LocalStore.get's.
LOCAL_TIMEOUT = 300.0
# torch's client puts this before every key its caller names; LocalStore does the same.
KEY_PREFIX = b"/"
MAX_REMEMBERED = 64


# What each query does to the table, and how its result is answered (None: no answer). WAIT, BARRIER and
# CANCEL_WAIT concern the client's own pending wait: _Session answers them.
ANSWERS: dict[Query, tuple[Callable[..., Any], Callable[[Any], bytes] | None]] = {
    Query.SET: (Table.put, None),
    Query.COMPARE_SET: (Table.compare_set, c10d.blob),
    Query.GET: (Table.get, c10d.blob),
    Query.ADD: (Table.add, c10d.i64),
    Query.CHECK: (Table.check, c10d.flag),
    Query.GETNUMKEYS: (Table.num_keys, c10d.i64),
    Query.DELETE_KEY: (Table.delete, lambda deleted: c10d.i64(int(deleted))),
    Query.APPEND: (Table.append, None),
    Query.MULTI_GET: (Table.get_many, c10d.blobs),
    Query.MULTI_SET: (Table.put_many, None),
    Query.PING: (lambda _table, nonce: nonce, c10d.u32),
    Query.QUEUE_PUSH: (Table.push, None),
    Query.QUEUE_POP: (Table.pop, c10d.popped),
    Query.QUEUE_LEN: (Table.queue_len, c10d.i64),
    Query.LIST_KEYS: (Table.list_keys, c10d.listing),
}


class _Session:
    """One client's connection: answers its messages in order, holds its pending WAIT or BARRIER."""

    def __init__(self, table: Table, writer: asyncio.StreamWriter) -> None:
        self.table = table
        self.writer = writer
        self.waiter: Waiter | None = None

    def answer(self, query: Query, fields: list[Any]) -> None:
        if query in ANSWERS:
            act, encode = ANSWERS[query]
            result = act(self.table, *fields)
            reply = encode(result) if encode else None
        elif query is Query.WAIT:
            reply = self._wait(self.table.wait, set(fields[0]))
        elif query is Query.BARRIER:
            reply = self._wait(lambda waiter: self.table.barrier(fields[0], fields[1], waiter))
        elif query is Query.CANCEL_WAIT:
            self.close()
            reply = c10d.WAIT_CANCELED
        else:  # VALIDATE: the first message only, read before any answer
            raise c10d.Malformed(f"{query.name} after the first message")
        if reply:
            self.writer.write(reply)

    def _wait(self, register: Callable[[Waiter], bool], keys: Iterable[bytes] = ()) -> bytes | None:
        """STOP_WAITING now where `register` says the wait is over; otherwise that answer comes when it is."""
        if self.waiter is not None:
            raise c10d.Malformed("a WAIT while another is pending")
        waiter = Waiter(keys, self._woken)
        if register(waiter):
            return STOP_WAITING
        self.waiter = waiter
        return None

    def _woken(self) -> None:
        self.waiter = None
        self.writer.write(STOP_WAITING)

    def close(self) -> None:
        if self.waiter is not None:
            self.table.forget(self.waiter)
            self.waiter = None


class C10dServer:
    """Serves the protocol on host:port (host None: every address; port 0: the kernel's pick, see `port`), or on
    a listening socket handed in, from an event loop on a daemon thread of its own. `accept(address)` is asked
    about each new connection before a byte of it is read: False (or an error) closes it unread."""

    def __init__(self, host: str | None = None, port: int = 0, *, sock: socket.socket | None = None,
                 accept: Accept | None = None, log: Callable[[str], None] = print,
                 max_keys: int = MAX_KEYS, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.table = Table(max_keys, max_bytes)
        self.closed = 0  # clients closed for what they sent
        self._where = (host, port, sock)
        self._accept = accept
        self._log = log
        self._logged: dict[str, None] = {}  # addresses whose first closing was logged, oldest first
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    def start(self) -> C10dServer:
        """Listens (raises OSError where it cannot), then serves on the loop's thread."""
        ready = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failed), name="elasticjob-c10d", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        """Closes every client and the listening socket, and ends the loop's thread."""
        if self._thread is None or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(CALL_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) run on the loop (where the table may be touched), from any other thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("C10dServer.call from the server's own loop would wait for itself")
        if not self._loop.is_running():
            raise RuntimeError("the c10d server is not running")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                done.set_exception(err)

        self._loop.call_soon_threadsafe(run)
        return done.result(CALL_TIMEOUT)

    def local(self, timeout: float = LOCAL_TIMEOUT) -> LocalStore:
        return LocalStore(self, timeout)

    def _run(self, ready: threading.Event, failed: list[BaseException]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(self._listen())
        except BaseException as err:  # noqa: BLE001 - handed to start()'s caller
            failed.append(err)
            ready.set()
            return
        ready.set()
        self._loop.run_forever()

    async def _listen(self) -> asyncio.Server:
        host, port, sock = self._where
        if sock is not None:
            return await asyncio.start_server(self._serve, sock=sock, backlog=BACKLOG)
        return await asyncio.start_server(self._serve, host=host, port=port, reuse_address=True, backlog=BACKLOG)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        peers.probe_idle(writer.get_extra_info("socket"))
        session = _Session(self.table, writer)
        try:
            if await self._admit(address):
                await self._converse(reader, session)
        except (c10d.Malformed, StoreFull) as err:
            self._closing(address, err)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the client went away, between messages or in one: nothing to answer
        except asyncio.CancelledError:
            pass  # stop(): ended here, as asyncio's streams (3.11) report a handler that ends cancelled as failed
        finally:
            session.close()
            writer.transport.abort()
            self._tasks.discard(task)

    async def _admit(self, address: str) -> bool:
        if self._accept is None:
            return True
        try:
            return bool(await self._accept(address))
        except Exception as err:  # noqa: BLE001 - a hook that fails refuses; the store serves on
            self._log(f"store: the accept hook failed for {address}, refused: {err!r}")
            return False

    async def _converse(self, reader: asyncio.StreamReader, session: _Session) -> None:
        query, fields = await c10d.read_query(reader)
        if query is not Query.VALIDATE or fields[0] != c10d.MAGIC:
            raise c10d.Malformed(f"the first message is {query.name} {fields[:1]}, not VALIDATE {c10d.MAGIC:#x}")
        while True:
            try:
                query, fields = await c10d.read_query(reader)
            except asyncio.IncompleteReadError as err:
                if not err.partial:
                    return  # closed between messages
                raise
            session.answer(query, fields)
            await session.writer.drain()  # a client that reads no replies stops being read

    def _closing(self, address: str, err: Exception) -> None:
        self.closed += 1
        if address in self._logged:
            return
        self._logged[address] = None
        while len(self._logged) > MAX_REMEMBERED:
            self._logged.pop(next(iter(self._logged)))
        self._log(f"store: closed a client at {address}: {err} (only the first from an address is logged)")


def _key(key: str) -> bytes:
    return KEY_PREFIX + key.encode()


def _value(value: Value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class LocalStore:
    """The store as a torch TCPStore client on the loopback sees it (the same key names: the "/" torch's client
    adds is added here), for the store's own threads, without a socket. The methods are torch's Store methods
    of the same names; get waits for its key as torch's does (TimeoutError past `timeout` seconds)."""

    def __init__(self, server: C10dServer, timeout: float = LOCAL_TIMEOUT) -> None:
        self._server = server
        self._table = server.table
        self.timeout = timeout

    def set(self, key: str, value: Value) -> None:
        self._server.call(self._table.put, _key(key), _value(value))

    def get(self, key: str) -> bytes:
        arrived = threading.Event()
        waiter = Waiter([_key(key)], arrived.set)
        if not self._server.call(self._table.wait, waiter) and not arrived.wait(self.timeout):
            self._server.call(self._table.forget, waiter)
            raise TimeoutError(f"the store's key {key!r} was not set within {self.timeout} s")
        return self._server.call(self._table.get, _key(key))

    def check(self, keys: list[str]) -> bool:
        return self._server.call(self._table.check, [_key(key) for key in keys])

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        return self._server.call(self._table.compare_set, _key(key), _value(expected_value), _value(desired_value))

    def add(self, key: str, value: int) -> int:
        return self._server.call(self._table.add, _key(key), value)

    def delete_key(self, key: str) -> bool:
        return self._server.call(self._table.delete, _key(key))

    def num_keys(self) -> int:
        return self._server.call(self._table.num_keys)
