"""One asyncio task per ElasticJob, woken by watch events; no finalizer needed.

kopf daemons would do this too, but they put a finalizer on every job: with the operator stopped or
uninstalled, deleting a job (or its namespace) would then hang. Owned pods need no finalizer (garbage
collection removes them), so the loops live here and end when the job leaves the mirror (a DELETED event,
or a list after a watch gap that no longer has it).
Many events between two reconciles coalesce into one wake-up, so the work per event stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from elasticjob import backoff

# Reconciles in flight at once, as controller-runtime's MaxConcurrentReconciles: a fleet created at once would
# otherwise build every job's manifests and hold every reply together, and the allocator keeps that peak.
CONCURRENT_RECONCILES = 32


@dataclass
class JobLoop:
    key: Hashable
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Any] | None = None
    memory: Any = None  # what the reconcile keeps between runs


@dataclass
class Budget:
    """At most `burst` at once, then one more every `every` seconds (a token bucket): what a job's own workload
    can make the operator do (post Events, read logs) stays bounded however often it is asked."""

    burst: float
    every: float
    tokens: float | None = None  # full at first
    at: float = 0.0  # time.monotonic() of the last refill

    def take(self, now: float) -> bool:
        tokens = self.burst if self.tokens is None else min(self.burst, self.tokens + (now - self.at) / self.every)
        self.at = now
        if tokens < 1:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1
        return True

    def wait(self, now: float) -> float:
        """Seconds until `take` would succeed."""
        if self.tokens is None:
            return 0.0
        tokens = min(self.burst, self.tokens + (now - self.at) / self.every)
        return max(0.0, (1 - tokens) * self.every)


# Reconcile once; returns the seconds after which to run again unwoken.
Reconcile = Callable[[JobLoop], Awaitable[float]]


class JobLoops:
    def __init__(self, reconcile: Reconcile, logger: logging.Logger,
                 concurrency: int = CONCURRENT_RECONCILES) -> None:
        self._reconcile, self._log = reconcile, logger
        self._loops: dict[Hashable, JobLoop] = {}
        self._slots = asyncio.Semaphore(concurrency)

    def observe(self, key: Hashable) -> JobLoop:
        """Wake the job's loop, starting it on first sight."""
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = JobLoop(key=key)
            loop.task = asyncio.create_task(self._run(loop), name=f"reconcile {key}")
        loop.wake.set()
        return loop

    def wake(self, key: Hashable) -> None:
        if (loop := self._loops.get(key)) is not None:
            loop.wake.set()

    async def forget(self, key: Hashable) -> None:
        if (loop := self._loops.pop(key, None)) is not None and loop.task is not None:
            loop.task.cancel()
            await asyncio.gather(loop.task, return_exceptions=True)

    async def stop_all(self) -> None:
        """Every loop cancelled before any is awaited: a loop cancelled while it held a slot would otherwise hand
        the slot to a waiting one, which would start a pass during the shutdown."""
        loops, self._loops = list(self._loops.values()), {}
        tasks = [loop.task for loop in loops if loop.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._loops)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._loops

    async def _run(self, loop: JobLoop) -> None:
        while True:
            try:
                async with self._slots:
                    loop.wake.clear()  # after the wait for a slot: what came meanwhile is seen by this pass
                    delay = await self._reconcile(loop)
            except asyncio.CancelledError:
                raise
            except Exception:  # one job's surprise must not end its loop, nor touch the others
                self._log.exception(f"reconcile of {loop.key} failed; retrying in {backoff.LOOP_CRASH:.0f} s")
                delay = backoff.LOOP_CRASH
            try:
                await asyncio.wait_for(loop.wake.wait(), delay)
            except TimeoutError:
                pass
