"""The link probe's verdict for the latest round (elasticjob_warm/linkprobe.py): the round's rank 0 writes it under
the round's own prefix once the agents measured their links, and the store shows it to the operator with the
outlier's rank turned into that agent's address (planner/links.py replaces that pod).

Anyone who reaches the store's port can write the key (the gate lets only the job's own pods do so): it is the
tenant's word. It is size-capped and every field typed and bounded (check); the rank must be one of the round's.
The store reads it at each tick for LINGER seconds after a round completed, until it is there.
"""

from __future__ import annotations

import json
from typing import Any

from elasticjob_store.protocol_state import LinksWire

REPORT_KEY = "elasticjob.links"  # elasticjob_warm.linkprobe writes it (it imports this module)
VERSION = 1
MAX_REPORT_BYTES = 4096
SUMMARY_RANKS = 256  # the report's per-rank figures stop there (the outlier is named whatever the world)
MAX_WORLD = 1 << 16
MAX_MBPS = 99_999  # the report's figures are clamped to keep it under MAX_REPORT_BYTES: 100 GB/s ...
MAX_MICROSECONDS = 999_999  # ... and 1 s
MAX_REASON = 240
FIELDS = ("v", "world", "seconds", "outlier", "reason", "bandwidthMBps", "latencyUs")
# Rounds of fewer agents are not probed (a pair's one slow link cannot say which end is slow): elasticjob_warm's
# roundprobe and linkprobe.outlier use this, and the store reads no verdict for them.
MIN_AGENTS = 3
# The probe runs once the round formed and is bounded by ELASTICJOB_LINK_PROBE_SECONDS (10 s by default).
LINGER = 30.0


def key(run_id: str, round_number: int) -> str:
    """Where the round's rank 0 writes: torch's PrefixStore over the rendezvous store names keys so."""
    return f"torch.rendezvous.{run_id}.{round_number}/{REPORT_KEY}"


def _int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def check(raw: bytes) -> dict[str, Any] | None:
    """The report, every field checked (type, bounds, lengths): None for anything else."""
    if not isinstance(raw, bytes) or len(raw) > MAX_REPORT_BYTES:
        return None
    try:
        report = json.loads(raw.decode())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(report, dict) or sorted(report) != sorted(FIELDS) or not _int(report["v"], VERSION, VERSION):
        return None
    world, seconds, rank, reason = report["world"], report["seconds"], report["outlier"], report["reason"]
    if not _int(world, 1, MAX_WORLD) or type(seconds) not in (int, float) or not 0 <= seconds <= 3600:
        return None
    if (rank is None) != (reason is None) or not (rank is None or _int(rank, 0, world - 1)):
        return None
    if reason is not None and not (isinstance(reason, str) and len(reason) <= MAX_REASON and reason.isprintable()):
        return None
    for name, most in (("bandwidthMBps", MAX_MBPS), ("latencyUs", MAX_MICROSECONDS)):
        values = report[name]
        if not isinstance(values, list) or len(values) != min(world, SUMMARY_RANKS):
            return None
        if not all(value is None or _int(value, 0, most) for value in values):
            return None
    return report


class LinkReader:
    """The verdict of the latest completed round, once read."""

    def __init__(self) -> None:
        self.round: int | None = None
        self.verdict: LinksWire | None = None

    def wanted(self, round_number: int | None, completed_at: float | None, now: float) -> bool:
        """Whether to read the key now: a round newer than the verdict's, within LINGER of its completion."""
        if round_number is None or completed_at is None:
            return False
        if round_number != self.round:
            self.round, self.verdict = round_number, None
        return self.verdict is None and now - completed_at <= LINGER

    def take(self, raw: bytes, addresses: dict[int, str]) -> None:
        """The verdict in `raw`, its outlier's rank turned into that member's address (`addresses`: the round's
        ranks); a verdict naming a rank the round does not have, or a world it does not have, is refused."""
        report = check(raw) if raw else None
        if report is None or self.round is None or report["world"] != len(addresses):
            return
        outlier = report["outlier"]
        if outlier is not None and outlier not in addresses:
            return
        verdict: LinksWire = {"round": self.round, "world": report["world"], "seconds": report["seconds"],
                              "outlier": addresses[outlier] if outlier is not None else None,
                              "reason": report["reason"]}
        self.verdict = verdict

    def describe(self) -> LinksWire | None:
        return self.verdict
