"""Which agents are still connected to the store, from the kernel's own table of the pod's TCP connections.

A killed agent's kernel closes its connection to the store at once, but its node stays a participant of the
round until its heartbeats expire or the operator sees the pod's end through the kubelet (about 2 s, measured):
the survivors, whose collective broke at once, wait in the wait list until then. The store sees the close
itself: an address that had a connection to the store's port and has none now is an agent that is gone, and
its nodes are removed as the operator would remove them (actions.remove_node, fenced by heartbeat time).

Only evidence no neighbour can forge counts: a connection that closed from an address that was a participant's.
A stranger can open and close its own connections, never one from a participant's address. Where the agents'
addresses never show (a network that rewrites source addresses), nothing is ever removed here.

A connection that stays open with no one behind it (a partition, a lost node) is seen here too, and reported, not
acted on: every agent connection has TCP keep-alive (a probe after a second without traffic, `probe_idle`), and
the kernel's table counts the probes and the data that the remote kernel left unacknowledged. A live process on a
reachable node, however frozen or starved, has its kernel answer within milliseconds; an address whose kernel
answers nothing for UNANSWERED_AFTER is cut off from the store. The store shows how long (`Silences`) and the
operator, which sees the heartbeats stop too, takes the agent out of its round: the store's word, so never its pod.
That is the evidence for a script that reports no progress (whose stall the store cannot see), about 2 s sooner
than the pod's readiness.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ESTABLISHED = "01"
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
# Columns of a row of /proc/net/tcp: the unrecovered retransmission timeouts, and the keep-alive probes unanswered.
RETRANSMITS, PROBES = 6, 8
# Seconds an address must leave everything unanswered before it counts as cut off: two of the poller's ticks, far
# above any ACK delay of a loaded node, far below the keep-alive interval torch's agents heartbeat at.
UNANSWERED_AFTER = 0.5
# TCP keep-alive on the agents' connections: a probe after KEEP_ALIVE_IDLE seconds without traffic, then every
# KEEP_ALIVE_INTERVAL; the kernel closes a connection after KEEP_ALIVE_COUNT unanswered (Departures then sees it).
KEEP_ALIVE_IDLE, KEEP_ALIVE_INTERVAL, KEEP_ALIVE_COUNT = 1, 1, 10


def probe_idle(sock: Any) -> None:
    """TCP keep-alive on an accepted agent connection (a socket, or asyncio's wrapper of one), so that a remote
    kernel that stopped answering shows."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEP_ALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEP_ALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEP_ALIVE_COUNT)
    except OSError:
        pass  # not TCP (a test's socket pair): nothing to probe


@dataclass(frozen=True)
class Reading:
    """One read of the kernel's tables for the store's port: who is connected, and whose kernel leaves a keep-alive
    probe or data unacknowledged now. The poller needs both each tick, from one read."""

    connected: set[str]
    unanswered: set[str]


def read(port: int, tables: Iterable[Path] = TABLES) -> Reading | None:
    """The tables for local `port`, read once; None where none is readable."""
    texts = []
    for table in tables:
        try:
            texts.append(table.read_text())
        except OSError:
            continue
    if not texts:
        return None
    return Reading(set().union(*(remote_addresses(text, port) for text in texts)),
                   set().union(*(unanswered_addresses(text, port) for text in texts)))


def remote_addresses(table: str, port: int) -> set[str]:
    """Parses one /proc/net/tcp{,6} table."""
    return {address for address, _ in _established(table, port)}


def unanswered_addresses(table: str, port: int) -> set[str]:
    """Of one table's connections to `port`, the remote addresses of those with a retransmission timeout or a
    keep-alive probe unanswered (both counters drop to 0 at the remote kernel's next ACK)."""
    found = set()
    for address, fields in _established(table, port):
        try:
            if len(fields) > PROBES and (int(fields[RETRANSMITS], 16) > 0 or int(fields[PROBES]) > 0):
                found.add(address)
        except ValueError:
            continue
    return found


def _established(table: str, port: int) -> Iterator[tuple[str, list[str]]]:
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != ESTABLISHED:
            continue
        local_port = fields[1].rpartition(":")[2]
        remote = fields[2].rpartition(":")[0]
        try:
            if int(local_port, 16) == port:
                yield _address(remote), fields
        except ValueError:
            continue


def _address(hex_ip: str) -> str:
    """The kernel writes each 32-bit word of the address in host (little-endian) order."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class Departures:
    """Addresses seen connected, and which of them have no connection any more."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def gone(self, now_connected: set[str], addresses: Iterable[str]) -> list[str]:
        """Of the nodes' `addresses`, those once seen connected that have no connection now; each is reported
        once (seen again only once it connects again)."""
        wanted = {normal(a) for a in addresses}
        left = sorted(a for a in wanted if a in self.seen and a not in now_connected)
        self.seen = (self.seen | (now_connected & wanted)) - set(left)
        return left


class Silences:
    """Since when each address has left the store unanswered (`Reading.unanswered`), across the poller's ticks."""

    def __init__(self, after: float = UNANSWERED_AFTER) -> None:
        self.after = after
        self._since: dict[str, float] = {}

    def update(self, now_unanswered: set[str] | None, now: float) -> None:
        """`now_unanswered` None (no table to read): nothing is known, so nothing is reported."""
        self._since = {a: self._since.get(a, now) for a in now_unanswered or ()}

    def silent(self, now: float) -> dict[str, float]:
        """The addresses unanswered for UNANSWERED_AFTER at least, and for how many seconds."""
        return {a: round(now - since, 3) for a, since in self._since.items() if now - since >= self.after}


def normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address
