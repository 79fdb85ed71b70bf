"""The ranks' pace reports (elasticjob_progress/pace.py, one key per global rank): each checked, kept with the
time this store saw it change, and summed up per pod for the operator, who compares the pods (the operator's
planner/stragglers.py).

Anyone who reaches the store's port can write these keys: they are the tenant's word. Each is size-capped and
every field typed and bounded; the store reads at most MAX_RANKS of them, every READ_EVERY seconds, and shows at
most MAX_PODS pods. The worst a lying report can do is have the operator replace one of the job's own pods
through a planned stop, uncharged, at most once per window of the job's own spec.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from elasticjob_store.progress import versioned
from elasticjob_store.protocol_state import PaceWire

# elasticjob_progress.pace.KEY_PREFIX (a unit test keeps the two equal).
KEY_PREFIX = "elasticjob.pace."
MAX_BYTES = 512
MAX_RANKS = 1024
MAX_PODS = 256
MAX_POD = 253
MAX_SECONDS = 3600.0
MAX_SAMPLES = 10**6
# How often the keys are read: the writers write every 2 s.
READ_EVERY = 2.0
# A report this store has not seen change for this long is of a process that is gone (or stuck): left out.
STALE_AFTER = 10.0
# A pod this many times slower than the median of the others is worth a look by the operator: the long-poll
# answers when which pod that is changes. The spec's own factor is never below it (models: stragglers.factor).
LOOK_FACTOR = 1.5


def key(rank: int) -> str:
    return f"{KEY_PREFIX}{rank}"


def check(raw: bytes) -> dict[str, Any] | None:
    """The report in `raw`, every field checked; None when any is wrong (a pace without its pod says nothing)."""
    body = versioned(raw, MAX_BYTES)
    if body is None:
        return None
    pod, rank, world = body.get("pod"), body.get("rank"), body.get("world")
    seconds: Any = body.get("seconds")
    samples = body.get("samples")
    if not isinstance(pod, str) or not pod or len(pod) > MAX_POD or not pod.isprintable():
        return None
    if type(rank) is not int or type(world) is not int or not 0 <= rank < world <= MAX_RANKS:
        return None
    if type(seconds) not in (int, float) or not math.isfinite(seconds) or not 0 < seconds <= MAX_SECONDS:
        return None
    if type(samples) is not int or not 0 < samples <= MAX_SAMPLES:
        return None
    return {"pod": pod, "rank": rank, "world": world, "seconds": float(seconds), "samples": samples}


class PaceReader:
    """The latest report of each rank and when this store saw it change (its own clock)."""

    def __init__(self) -> None:
        self._raw: dict[int, bytes] = {}
        self._reports: dict[int, tuple[dict[str, Any], float]] = {}
        # The world each rank's key last named, dropped report or not: which keys to read.
        self._worlds: dict[int, int] = {}
        self._read_at = -math.inf

    def due(self, now: float) -> bool:
        if now - self._read_at < READ_EVERY:
            return False
        self._read_at = now
        return True

    def ranks(self) -> range:
        """The ranks to read: rank 0's, and as many as the largest world a key names."""
        return range(min(max(self._worlds.values(), default=1), MAX_RANKS))

    def take(self, rank: int, raw: bytes, now: float) -> None:
        if raw == self._raw.get(rank):
            return
        self._raw[rank] = raw
        report = check(raw)
        if report is None or report["rank"] != rank:
            self._reports.pop(rank, None)
            self._worlds.pop(rank, None)
        else:
            self._reports[rank] = (report, now)
            self._worlds[rank] = report["world"]

    def forget_stale(self, now: float, round_began: float | None = None) -> None:
        """Drops the reports not renewed for STALE_AFTER, and those read at or before the current round formed
        (`round_began`): they are of processes the round's restart ended, and their pod (or its replacement, of the
        same name) now runs others."""
        for rank in [r for r, (_, seen) in self._reports.items()
                     if now - seen > STALE_AFTER or (round_began is not None and seen <= round_began)]:
            del self._reports[rank]

    def by_pod(self, now: float) -> list[PaceWire]:
        """Each pod's pace: the slowest of its ranks (one slow GPU slows its whole pod's share), fresh reports only.
        Sorted by pod name."""
        pods: dict[str, PaceWire] = {}
        for report, seen in self._reports.values():
            if now - seen > STALE_AFTER:
                continue
            entry = pods.setdefault(report["pod"], {"pod": report["pod"], "seconds": 0.0, "ranks": 0})
            entry["seconds"] = max(entry["seconds"], report["seconds"])
            entry["ranks"] += 1
        return [pods[name] for name in sorted(pods)[:MAX_PODS]]

    def landmark(self, now: float) -> str | None:
        """The pod LOOK_FACTOR times slower than the median of the others, if any: what wakes the operator."""
        found = slowest(self.by_pod(now))
        return None if found is None or found[1] < LOOK_FACTOR else found[0]


def slowest(pods: list[PaceWire]) -> tuple[str, float] | None:
    """The slowest pod and how many times the median of the others' its pace is; None for fewer than two."""
    if len(pods) < 2:
        return None
    worst = max(pods, key=lambda entry: (entry["seconds"], entry["pod"]))
    others = statistics.median(entry["seconds"] for entry in pods if entry is not worst)
    return worst["pod"], worst["seconds"] / others if others > 0 else math.inf
