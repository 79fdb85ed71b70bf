"""Seats: with warm spares (spec.spares), how many of the job's agents may be in its rounds at once. Pure.

A job with spares runs `replicas + spares` worker pods, all alike; the store hands out `replicas` seats. An agent
joins a round only while it holds one (elasticjob_warm/seat.py asks before every join); the others wait warm, with
torch imported and their node checked: the spares. Which pod is a spare is decided here at run time, not by its
name, so the pod that replaces a lost one is simply the next spare.

The wire, in the store's own keys beside torch's (the peer gate lets only the job's pods write them):
- an agent that wants a seat takes a slot number with add(COUNT_KEY, 1) and writes its address under
  ASK_PREFIX + that number; it asks again every ASK_EVERY seconds while it waits;
- the store reads the new slots at each tick, deletes them, and writes HELD_KEY: the seats' count and the addresses
  holding one (JSON, version 1), which the agents poll. An agent whose address is listed joins.

A seat is held by an address while that address is in the rendezvous state (a participant, waiting, or with a
heartbeat), and, once granted, for GRANT_TTL seconds until it first shows there. It frees when the address has left
the state and its connection to the store closed, or has left it for ABSENT_GRACE seconds (torch takes an agent
out of the old round just before it joins the next: a survivor must not lose its seat in between). A spare whose
connection closed, or that stopped asking, is forgotten. Asks are the tenant's word (only the job's own pods reach
the store): each slot is size-capped and must hold an IP address; an ask for an address that never joins holds a
seat GRANT_TTL seconds at most.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from elasticjob_store.protocol_state import SeatsWire

COUNT_KEY = "elasticjob.seat.count"
ASK_PREFIX = "elasticjob.seat.ask."
HELD_KEY = "elasticjob.seat.held"
ASK_EVERY = 5.0  # an agent waiting for a seat writes its ask again this often
ASK_TTL = 3 * ASK_EVERY  # a spare not heard from for this long is gone (its pod deleted while it waited)
GRANT_TTL = 10.0  # a seat granted to an agent that has not joined yet: its agent polls HELD_KEY every 0.1 s
ABSENT_GRACE = 1.0  # a holder out of the state this long frees its seat even while connected (a cut-off pod)
MAX_SLOTS = 256  # slots read in one tick; a count further ahead than MAX_SKIP is a forged one, skipped
MAX_SKIP = 4096
MAX_ASK_BYTES = 64


def ask_key(slot: int) -> str:
    return f"{ASK_PREFIX}{slot}"


def address(raw: bytes) -> str | None:
    """The IP address an ask holds, in its normal spelling; None for anything else."""
    if len(raw) > MAX_ASK_BYTES:
        return None
    try:
        return str(ipaddress.ip_address(raw.decode("ascii").strip()))
    except (UnicodeDecodeError, ValueError):
        return None


def held_wire(count: int | None, held: Iterable[str], epoch: str) -> bytes:
    return json.dumps({"v": 1, "epoch": epoch, "count": count, "held": sorted(held)},
                      separators=(",", ":")).encode()


@dataclass
class Holder:
    granted_at: float
    seen: bool = False  # its address has been in the rendezvous state since the grant
    absent_since: float | None = None


class Seats:
    """The store's seat table. `count` None: no seats (a job without spares), every agent joins at once."""

    def __init__(self, count: int | None = None) -> None:
        self.count = count
        self.held: dict[str, Holder] = {}
        self.waiting: dict[str, tuple[float, float]] = {}  # address -> (first asked, last asked)
        self.cursor = 0  # the last slot read
        self.seen_connected: set[str] = set()  # tracked addresses once seen in the connection table
        self.granted_total = 0

    def slots(self, count_value: int) -> range:
        """The ask slots to read now, given COUNT_KEY's value; moves the cursor past them."""
        if count_value < self.cursor or count_value - self.cursor > MAX_SKIP:
            self.cursor = count_value  # a count written back or forged ahead: read from here on
            return range(0)
        first = self.cursor + 1
        self.cursor = min(count_value, self.cursor + MAX_SLOTS)
        return range(first, self.cursor + 1)

    def asked(self, addr: str, now: float) -> None:
        if self.count is None or addr in self.held:
            return
        first, _ = self.waiting.get(addr, (now, now))
        self.waiting[addr] = (first, now)

    def release(self, addr: str) -> bool:
        """Frees the seat of an agent taken out of the rendezvous for good; whether it held one."""
        return self.held.pop(normal(addr), None) is not None

    def update(self, in_state: set[str] | None, connected: set[str] | None, now: float) -> list[str]:
        """Frees the seats of agents gone, forgets spares gone, grants free seats to the spares that asked
        first; returns the addresses granted now. `in_state` None: the state could not be read, and only a
        closed connection frees a seat. `connected` None: no connection table to read. An address counts as
        gone by the table only once it was seen connected (as peers.Departures: a network may rewrite it)."""
        tracked = set(self.held) | set(self.waiting)
        if connected is not None:
            self.seen_connected |= connected & tracked

        def gone(addr: str) -> bool:
            return connected is not None and addr in self.seen_connected and addr not in connected

        for addr, holder in list(self.held.items()):
            if in_state is None or addr in in_state:
                holder.seen, holder.absent_since = holder.seen or in_state is not None, None
                if in_state is None and gone(addr):
                    del self.held[addr]
                continue
            if holder.absent_since is None:
                holder.absent_since = now
            if holder.seen and (gone(addr) or now - holder.absent_since >= ABSENT_GRACE) \
                    or not holder.seen and now - holder.granted_at >= GRANT_TTL:
                del self.held[addr]
        self.waiting = {addr: asked for addr, asked in self.waiting.items()
                        if addr not in self.held and now - asked[1] < ASK_TTL and not gone(addr)}
        self.seen_connected &= set(self.held) | set(self.waiting)
        if self.count is None:
            return []
        free = self.count - len(self.held)
        granted = sorted(self.waiting, key=lambda a: (self.waiting[a][0], a))[:max(0, free)]
        for addr in granted:
            del self.waiting[addr]
            self.held[addr] = Holder(granted_at=now)
        self.granted_total += len(granted)
        return granted

    def describe(self) -> SeatsWire | None:
        if self.count is None:
            return None
        return {"count": self.count, "held": sorted(self.held), "spares": sorted(self.waiting),
                "joining": sorted(a for a, h in self.held.items() if not h.seen), "granted": self.granted_total}

    def landmark(self) -> tuple[Any, ...]:
        return (self.count, tuple(sorted(self.held)), tuple(sorted(self.waiting)),
                tuple(sorted(a for a, h in self.held.items() if not h.seen)))


def normal(addr: str) -> str:
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return addr


def state_addresses(state: Any) -> set[str]:
    """Every address in a decoded rendezvous state, in normal spelling."""
    if state is None:
        return set()
    found = set()
    for node in (*state.participants, *state.wait_list, *state.redundancy_list, *state.last_heartbeats):
        found.add(normal(node.addr))
    return found
