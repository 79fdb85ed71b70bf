"""The training's progress report (elasticjob_progress, written by rank 0 under KEY), checked and kept with the
time the store first saw it, and whether the training has stalled.

Anyone who reaches the store's port can write the key: the report is the tenant's own word. It is size-capped,
every field typed and bounded, and anything else is dropped; the operator shows it and never charges or fences on
it. A stall only hastens taking a silent agent out of the tenant's own rendezvous (the operator's
planner/recovery.py), which the heartbeats (the tenant's word too) do anyway a few seconds later.
"""

from __future__ import annotations

import json
import math
from typing import Any, cast

from elasticjob_store.protocol_state import ProgressWire

# elasticjob_progress.report.KEY (a unit test keeps the two equal).
KEY = "elasticjob.progress"
MAX_BYTES = 2048
MAX_STEP = 2**53
MAX_UNIX = 1e11
MAX_POD = 253
MAX_STEP_SECONDS = 86400.0
TIMES = ("startedAt", "stepAt", "firstStepAt", "loadingAt", "sentAt")
STEPS = ("step", "firstStep")
MARKS = ("saved", "loaded", "stopped")
# Stalled: a report that named a step and has not changed for STALL_INTERVALS of the writer's interval (the
# report's own `interval`, elasticjob_progress.INTERVAL; a writer that does not say wrote once a second), and a
# slow step for STALL_STEPS of it. A step of 0.1 s changes the report at each write.
STALL_INTERVALS = 2.0
STALL_STEPS = 3
UNSTATED_INTERVAL = 1.0
# The store reads the report four times a second (control.POLL_INTERVAL): a shorter interval is read as this.
MIN_INTERVAL = 0.25
MAX_INTERVAL = 60.0


def _time(value: Any) -> float | None:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_UNIX:
        return None
    return float(value)


def _step(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_STEP else None


def _mark(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    step, at = _step(value.get("step")), _time(value.get("at"))
    return None if step is None or at is None else {"step": step, "at": at}


def versioned(raw: bytes, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object of version 1 in `raw`, of at most `max_bytes`; None for anything else. What a training's
    report under a key of the store is, before its fields are checked (here, and pace.py)."""
    if len(raw) > max_bytes:
        return None
    try:
        body = json.loads(raw)
    except Exception:  # noqa: BLE001 - not JSON, or JSON nested too deep for the parser (RecursionError): none
        return None
    return body if isinstance(body, dict) and body.get("v") == 1 else None


def check(raw: bytes) -> dict[str, Any] | None:
    """The report in `raw`, every field checked (a bad field is dropped, not the report); None when it is no
    report at all: too large, not JSON, not an object, or of another version."""
    body = versioned(raw, MAX_BYTES)
    if body is None:
        return None
    pod = body.get("pod")
    seconds = _time(body.get("stepSeconds"))
    interval = _time(body.get("interval"))
    report: dict[str, Any] = {
        "pod": "".join(ch for ch in pod[:MAX_POD] if ch.isprintable()) if isinstance(pod, str) else "",
        "restart": _step(body.get("restart")) or 0,
        "stepSeconds": seconds if seconds is not None and seconds <= MAX_STEP_SECONDS else None,
        # The script asks should_stop(): a planned stop reaches it (elasticjob_progress/stop.py).
        "listens": body.get("listens") is True,
        "interval": None if interval is None else min(max(interval, MIN_INTERVAL), MAX_INTERVAL),
    }
    report.update({name: _time(body.get(name)) for name in TIMES})
    report.update({name: _step(body.get(name)) for name in STEPS})
    report.update({name: _mark(body.get(name)) for name in MARKS})
    return report


class ProgressReader:
    """The latest report and when this store first saw it (its own clock): read at each poller tick, decoded
    only when the bytes changed."""

    def __init__(self) -> None:
        self._raw = b""
        self.report: dict[str, Any] | None = None
        self.received_at: float | None = None
        # The pod that reported before the current one: when rank 0's pod is lost, the survivors' new rank 0 may
        # report before the operator books the loss, and the loss is still rank 0's (ledger.held_rank0).
        self.previous_pod = ""

    def take(self, raw: bytes, now: float) -> None:
        if raw == self._raw:
            return
        self._raw = raw
        before = self.report["pod"] if self.report is not None else ""
        self.report = check(raw) if raw else None
        self.received_at = now if self.report is not None else None
        if self.report is not None and before and self.report["pod"] != before:
            self.previous_pod = before

    def describe(self, now: float) -> ProgressWire | None:
        """The `progress` object of GET /v1/state; None before any valid report."""
        if self.report is None:
            return None
        # check() wrote every other field of ProgressWire, each checked.
        return cast(ProgressWire, {**self.report, "receivedAt": self.received_at, "stalled": self.stalled(now),
                                   "previousPod": self.previous_pod})

    def stalled(self, now: float) -> bool:
        """The training stepped, and its report has not changed since for longer than a few of its steps: every
        rank waits in a collective (a peer cut off, frozen, or gone without a word)."""
        report = self.report
        if report is None or report["step"] is None or self.received_at is None:
            return False
        step, interval = report["stepSeconds"] or 0.0, report["interval"] or UNSTATED_INTERVAL
        return now - self.received_at > max(STALL_INTERVALS * interval, interval + STALL_STEPS * step)

    def landmarks(self, now: float) -> tuple[Any, ...]:
        """What wakes the operator's long-poll: a new worker process, its first step, a checkpoint loaded, a planned
        stop done, the training stalling or stepping again. Not each step (that would be an answer a second); the
        operator reads those with the next answer."""
        if self.report is None:
            return ()
        report = self.report
        return (report["startedAt"], report["firstStepAt"], report["loadingAt"], report["loaded"],
                report["stopped"], self.stalled(now))
