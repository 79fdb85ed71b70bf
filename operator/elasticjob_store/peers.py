"""Which agents are still connected to the store, from the kernel's own table of the pod's TCP connections.

A killed agent's kernel closes its connection to the store at once, but its node stays a participant of the
round until its heartbeats expire or the operator sees the pod's end through the kubelet (about 2 s, measured):
the survivors, whose collective broke at once, wait in the wait list until then. The store sees the close
itself: an address that had a connection to the store's port and has none now is an agent that is gone, and
its nodes are removed as the operator would remove them (actions.remove_node, fenced by heartbeat time).

Only evidence no neighbour can forge counts: a connection that closed from an address that was a participant's.
A stranger can open and close its own connections, never one from a participant's address. Where the agents'
addresses never show (a network that rewrites source addresses), nothing is ever removed here. A connection that
stays open without an agent behind it (a partition, a lost node) is left to the operator, as before.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path

ESTABLISHED = "01"
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def connected(port: int, tables: Iterable[Path] = TABLES) -> set[str] | None:
    """The remote addresses with an established connection to local `port`; None where no table is readable."""
    found: set[str] = set()
    readable = False
    for table in tables:
        try:
            text = table.read_text()
        except OSError:
            continue
        readable = True
        found |= remote_addresses(text, port)
    return found if readable else None


def remote_addresses(table: str, port: int) -> set[str]:
    """Parses one /proc/net/tcp{,6} table."""
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != ESTABLISHED:
            continue
        local_port = fields[1].rpartition(":")[2]
        remote = fields[2].rpartition(":")[0]
        try:
            if int(local_port, 16) == port:
                found.add(_address(remote))
        except ValueError:
            continue
    return found


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
        wanted = {_normal(a) for a in addresses}
        left = sorted(a for a in wanted if a in self.seen and a not in now_connected)
        self.seen = (self.seen | (now_connected & wanted)) - set(left)
        return left


def _normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address
