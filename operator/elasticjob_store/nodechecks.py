"""What each agent's node check cost its join (elasticjob_warm/nodecheck.py report_later, one key per agent
address): read for the latest round's members, checked, and shown to the operator, whose ledger books the
longest hold among the agents that checked after a fault as the incident's nodeCheck phase.

Anyone who reaches the store's port can write these keys (the gate lets only the job's own pods do so): they are
the tenant's word, read for the ledger alone, never to charge or decide. Each is size-capped and every field typed
and bounded; the store reads at most MAX_NODES keys every READ_EVERY seconds, and at once when a round forms.
"""

from __future__ import annotations

import math
from typing import Any

from elasticjob_store.progress import versioned
from elasticjob_store.protocol_state import NodeCheckWire

# elasticjob_warm.nodecheck.KEY_PREFIX (a unit test keeps the two equal).
KEY_PREFIX = "elasticjob.nodecheck."
MAX_BYTES = 256
MAX_NODES = 256
MAX_SECONDS = 3600.0 + 60.0  # the check's budget at most (an hour), its process's import beside it
MAX_UNIX = 1e11
READ_EVERY = 2.0


def key(addr: str) -> str:
    return f"{KEY_PREFIX}{addr}"


def check(raw: bytes) -> dict[str, float] | None:
    """The report in `raw`, every field checked; None when any is wrong."""
    body = versioned(raw, MAX_BYTES)
    if body is None:
        return None
    found: dict[str, float] = {}
    for name, most in (("seconds", MAX_SECONDS), ("held", MAX_SECONDS), ("at", MAX_UNIX)):
        value: Any = body.get(name)
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= most:
            return None
        found[name] = float(value)
    return found


class NodeCheckReader:
    """The latest report of each member of the latest round, by agent address."""

    def __init__(self) -> None:
        self._reports: dict[str, dict[str, float]] = {}
        self._members: tuple[str, ...] = ()
        self._read_at = -math.inf

    def due(self, now: float, members: tuple[str, ...]) -> tuple[str, ...]:
        """The addresses to read now: the round's members, at once when they changed, else every READ_EVERY."""
        members = members[:MAX_NODES]
        if members == self._members and now - self._read_at < READ_EVERY:
            return ()
        self._read_at = now
        if members != self._members:
            self._members = members
            self._reports = {addr: report for addr, report in self._reports.items() if addr in members}
        return members

    def take(self, addr: str, raw: bytes) -> None:
        report = check(raw) if raw else None
        if report is None:
            self._reports.pop(addr, None)
        else:
            self._reports[addr] = report

    def describe(self) -> list[NodeCheckWire]:
        """The members' reports, by address."""
        return [{"addr": addr, "seconds": report["seconds"], "held": report["held"], "at": report["at"]}
                for addr, report in sorted(self._reports.items())]

    def landmark(self) -> tuple[tuple[str, float], ...]:
        """Which members have reported, and when: a new report wakes the operator's long-poll."""
        return tuple((addr, report["at"]) for addr, report in sorted(self._reports.items()))
