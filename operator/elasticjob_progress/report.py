"""What rank 0 tells the store: the latest step and checkpoint marks of this worker process, on its own clock.

The store's process reads it from KEY (elasticjob_store/progress.py checks every field; a unit test keeps the
two keys equal) and keeps the latest with the time it saw it change. Times are unix seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEY = "elasticjob.progress"
VERSION = 1
# How much each new step interval weighs in stepSeconds (an exponential mean: recent steps count most).
SMOOTHING = 0.2


@dataclass
class Report:
    pod: str
    started_at: float
    restart: int = 0
    step: int | None = None
    step_at: float | None = None
    step_seconds: float | None = None
    first_step: int | None = None
    first_step_at: float | None = None
    saved: tuple[int, float] | None = None
    loading: float | None = None
    loaded: tuple[int, float] | None = None
    listens: bool = False  # the script asks should_stop(): the operator may ask it to stop at a step
    stopped: tuple[int, float] | None = None  # every rank saved the planned stop's step and stopped
    # The least time between two writes: the store takes a report unchanged for two of them as a stall.
    interval: float | None = None
    # Bumped by every change: the reporter writes only when it moved since its last write.
    changes: int = 0

    def step_done(self, n: int, now: float) -> bool:
        """Notes step `n` at `now`; True for this process's first step."""
        first = self.first_step is None
        if first:
            self.first_step, self.first_step_at = n, now
        elif self.step_at is not None and n > (self.step or 0):
            interval = (now - self.step_at) / (n - (self.step or 0))
            mean = self.step_seconds
            self.step_seconds = interval if mean is None else mean + SMOOTHING * (interval - mean)
        self.step, self.step_at = n, now
        self.changes += 1
        return first

    def saved_at(self, n: int, now: float) -> None:
        self.saved = (n, now)
        self.changes += 1

    def loading_at(self, now: float) -> None:
        self.loading = now
        self.changes += 1

    def loaded_at(self, n: int, now: float) -> None:
        self.loaded = (n, now)
        self.changes += 1

    def listening(self) -> None:
        self.listens = True
        self.changes += 1

    def stopped_at(self, n: int, now: float) -> None:
        self.stopped = (n, now)
        self.changes += 1

    def wire(self, now: float) -> dict[str, Any]:
        def mark(pair: tuple[int, float] | None) -> dict[str, Any] | None:
            return None if pair is None else {"step": pair[0], "at": round(pair[1], 3)}

        def at(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {
            "v": VERSION, "pod": self.pod, "restart": self.restart, "startedAt": at(self.started_at),
            "step": self.step, "stepAt": at(self.step_at),
            "stepSeconds": None if self.step_seconds is None else round(self.step_seconds, 4),
            "firstStep": self.first_step, "firstStepAt": at(self.first_step_at),
            "saved": mark(self.saved), "loadingAt": at(self.loading), "loaded": mark(self.loaded),
            "listens": self.listens, "stopped": mark(self.stopped), "sentAt": at(now),
            "interval": self.interval,
        }
