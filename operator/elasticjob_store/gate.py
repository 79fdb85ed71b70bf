"""The store's own fence: the c10d port answers only the job's pods, whether or not NetworkPolicies are enforced.

torch's TCPStore has no way to refuse a peer: whoever reaches its port may write any key, torch's rendezvous
state included. So the TCPStore listens on the loopback alone (an inner port), and this gate listens on the
store's port in its place: it looks at each connection's source address and passes the bytes of the job's pods
through, unread, to the TCPStore. Every other peer is closed before a byte of it reaches the store.

The operator says which addresses are the job's (POST /v1/peers on the authenticated control port: every worker
pod of the job that has an IP, until it is gone), again whenever that changes and whenever the store restarted
(GET /v1/state shows the list the gate holds). A pod's agent may dial before the operator has told the gate
about the pod (its IP is known a few seconds before its agent starts, but the operator may be slow): such a
connection is held, unanswered, for HOLD seconds, and passed through as soon as the address is allowed. An
address taken off the list loses its connections at once: its pod is gone, and another pod may get the address.
Its new connections are refused at once too, for DEPARTED_MEMORY seconds, not held: a pod deleted at once still
runs for its grace period, and its agent, dialling to ask for a stop, would otherwise wait out the hold past the
kubelet's kill instead of stopping its workers (which then save) while it can.
The store pod's own processes (the loopback) always pass.

What the gate cannot see: a network that rewrites source addresses (a proxy, SNAT between pods) shows every
agent under one address that is not a pod's. The agents are then refused and the job shows it (the store's
refusals in its state, an Event); the operator's --no-store-peer-check turns the gate off.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from elasticjob_store import peers, protocol
from elasticjob_store.protocol_state import PeersWire

# How long a connection from an address not (yet) allowed waits for the operator to allow it.
HOLD = 20.0
# Connections held at once, in all and per address: a stranger cannot hold more than a few of them.
MAX_HELD = 256
MAX_HELD_PER_ADDRESS = 4
CHUNK = 1 << 16
# allow() waits this long at most for the gate's loop to close what it must.
APPLY_WAIT = 5.0
# Refused addresses remembered for the report and the log (the first refusal of each is logged).
MAX_REMEMBERED = 64
# How long an address taken off the list is refused at once rather than held (unless the operator names it again).
DEPARTED_MEMORY = 60.0

Query = dict[str, list[str]]  # as wire.Query
Route = Callable[[Any, Query], dict[str, Any]]


def normal(address: str) -> str:
    """An address as the operator writes it: an IPv4-mapped IPv6 address as plain IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Gate:
    """Listens on `port` (every address) and passes the allowed peers' connections to `inner_port` on the
    loopback. allow() and report() may be called from any thread; the connections live on the gate's own
    event loop thread."""

    def __init__(self, port: int, inner_port: int, *, hold: float = HOLD, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.time) -> None:
        self.port = port
        self.inner_port = inner_port
        self.hold = hold
        self._log = log
        self._clock = clock
        self._lock = threading.Lock()
        self._allowed: frozenset[str] = frozenset()
        self._told = False  # whether the operator has said anything since this process started
        self._told_at: float | None = None
        self.refused = 0
        self._refused_addresses: dict[str, float] = {}  # address -> last refusal, oldest first
        self._departed: dict[str, float] = {}  # address taken off the list -> when, oldest first
        self._held: dict[str, int] = {}
        self._open: dict[str, set[asyncio.StreamWriter]] = {}
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Condition | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._server: asyncio.AbstractServer | None = None

    # The operator's side.

    def allow(self, addresses: Iterable[str]) -> bool:
        """The job's pods are at `addresses` now; True when that changed the list."""
        wanted = frozenset(normal(address) for address in addresses)
        with self._lock:
            changed = wanted != self._allowed or not self._told
            now = self._clock()
            for gone in self._allowed - wanted:
                self._departed.pop(gone, None)
                self._departed[gone] = now
            for address in wanted:
                self._departed.pop(address, None)
            while len(self._departed) > MAX_REMEMBERED:
                self._departed.pop(next(iter(self._departed)))
            self._allowed, self._told, self._told_at = wanted, True, now
        if changed and self._loop.is_running():
            # Applied before the operator hears back: a pod taken off has lost its connections by then.
            asyncio.run_coroutine_threadsafe(self._apply(), self._loop).result(APPLY_WAIT)
        return changed

    def report(self) -> PeersWire:
        """What GET /v1/state shows of the gate."""
        with self._lock:
            return {"checked": True, "told": self._told, "allowed": sorted(self._allowed),
                    "refused": self.refused, "lastRefused": list(self._refused_addresses)[-8:],
                    "held": sum(self._held.values())}

    def allowed(self, address: str) -> bool:
        with self._lock:
            return loopback(address) or address in self._allowed

    # The event loop's side.

    def start(self) -> None:
        """Listens (raises OSError where the port is taken), then serves on a daemon thread."""
        thread = threading.Thread(target=self._run, name="elasticjob-gate", daemon=True)
        thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._changed = asyncio.Condition()
            server = self._loop.run_until_complete(asyncio.start_server(
                self._serve, host=None, port=self.port, reuse_address=True, backlog=1024))
        except BaseException as err:  # noqa: BLE001 - handed to start()'s caller
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        self._server = server  # kept: the listening socket lives as long as the process
        self._loop.run_forever()

    async def _apply(self) -> None:
        for address, writers in list(self._open.items()):
            if not self.allowed(address):
                for writer in list(writers):
                    writer.transport.abort()
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = normal(peer[0]) if peer else ""
        peers.probe_idle(writer.get_extra_info("socket"))
        try:
            if not await self._admit(address):
                self._refuse(address)
                return
            await self._pass(address, reader, writer)
        finally:
            writer.transport.abort()

    async def _admit(self, address: str) -> bool:
        if self.allowed(address):
            return True
        with self._lock:  # report() reads the counts from another thread
            departed = self._departed.get(address)
            if departed is not None and self._clock() - departed < DEPARTED_MEMORY:
                return False  # its pod is gone: nothing to wait for
            held = sum(self._held.values())
            if held >= MAX_HELD or self._held.get(address, 0) >= MAX_HELD_PER_ADDRESS:
                return False
            self._held[address] = self._held.get(address, 0) + 1
        assert self._changed is not None
        try:
            async with self._changed:
                return await asyncio.wait_for(self._changed.wait_for(lambda: self.allowed(address)), self.hold)
        except asyncio.TimeoutError:
            return False
        finally:
            with self._lock:
                self._held[address] -= 1
                if not self._held[address]:
                    del self._held[address]

    def _refuse(self, address: str) -> None:
        with self._lock:
            self.refused += 1
            first = address not in self._refused_addresses
            self._refused_addresses.pop(address, None)
            self._refused_addresses[address] = self._clock()
            while len(self._refused_addresses) > MAX_REMEMBERED:
                self._refused_addresses.pop(next(iter(self._refused_addresses)))
            told = self._told
        if first:
            why = "not one of the job's pods" if told else "the operator has not yet said which pods are the job's"
            self._log(f"store: refused a connection from {address}: {why}")

    async def _pass(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", self.inner_port)
        except OSError:
            return
        self._open.setdefault(address, set()).add(writer)
        try:
            if not self.allowed(address):  # taken off the list while it connected
                return
            await _splice(reader, writer, inner_reader, inner_writer)
        finally:
            inner_writer.transport.abort()
            writers = self._open.get(address)
            if writers is not None:
                writers.discard(writer)
                if not writers:
                    del self._open[address]


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  inner_reader: asyncio.StreamReader, inner_writer: asyncio.StreamWriter) -> None:
    """Bytes both ways until either side closes; then both are closed."""
    tasks = [asyncio.ensure_future(_copy(reader, inner_writer)), asyncio.ensure_future(_copy(inner_reader, writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await source.read(CHUNK)
            if not data:
                return
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        return


def peers_route(gate: Gate | None) -> Route:
    """POST /v1/peers: the addresses the gate lets through (with no gate, the store answers every peer: the
    operator's --no-store-peer-check, or a test's store; it says so rather than pretend)."""
    def peers(body: Any, _query: Query) -> dict[str, Any]:
        asked = protocol.Peers.from_wire(body)
        if gate is None:
            return protocol.PeersReply(False, "this store checks no peers").to_wire()
        changed = gate.allow(asked.addresses)
        return protocol.PeersReply(changed, "the job's pods" if changed else "unchanged",
                                   allowed=len(asked.addresses)).to_wire()
    return peers


def inner_socket() -> socket.socket:
    """The TCPStore's listening socket: the loopback only, on a port the kernel picks (TCPStore's
    master_listen_fd)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock
