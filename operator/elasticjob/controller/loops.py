"""One asyncio task per ElasticJob, woken by watch events; no finalizer needed.

kopf daemons would do this too, but they put a finalizer on every job: with the operator stopped or
uninstalled, deleting a job (or its namespace) would then hang. Owned pods need no finalizer (garbage
collection removes them), so the loops live here and end when the job leaves the mirror (a DELETED event,
or a list after a watch gap that no longer has it).
Many events between two reconciles coalesce into one wake-up, so the work per event stays bounded.
A reconcile that fails is retried on backoff.RECONCILE_FAILED, counted per job and reset by a success, as
controller-runtime's per-item rate limiter: a failing job does not spin, and an event still wakes it at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass, field
from typing import Any

from elasticjob import backoff

# Reconciles in flight at once, as controller-runtime's MaxConcurrentReconciles: a fleet created at once would
# otherwise build every job's manifests and hold every reply together, and the allocator keeps that peak.
CONCURRENT_RECONCILES = 32
# Passes that ask for another at once, run in the slot they hold (JobLoops._passes): bounded, so that a job that
# always asks cannot keep its slot.
FOLLOW_UPS = 2


@dataclass
class JobLoop:
    key: Hashable
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Any] | None = None
    memory: Any = None  # what the reconcile keeps between runs
    failures: int = 0  # reconciles failed in a row: the step of backoff.RECONCILE_FAILED the next retry waits
    forgotten: bool = False  # ends the loop even where a cancellation was swallowed


class Failed(Exception):
    """A reconcile failed in a way it expected (an API error): retried with backoff like any failure, but logged
    as a warning, without a traceback, on the job's own logger (its lines prefixed [namespace/name])."""

    def __init__(self, message: str, log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None):
        super().__init__(message)
        self.log = log


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


# Reconcile once; returns the seconds after which to run again unwoken, or raises to be retried with backoff.
Reconcile = Callable[[JobLoop], Awaitable[float]]
# Wait until the loop is woken or the seconds have passed (a test passes its own clock).
Wait = Callable[[asyncio.Event, float], Awaitable[None]]


async def wait_woken(wake: asyncio.Event, delay: float) -> None:
    """Not asyncio.wait_for: on Python 3.11 it returns normally when cancelled just as the wake came (a job's pod
    event, then its DELETED, handled in one go), and the forgotten loop would go on reconciling."""
    try:
        async with asyncio.timeout(delay if delay != float("inf") else None):
            await wake.wait()
    except TimeoutError:
        pass


class JobLoops:
    def __init__(self, reconcile: Reconcile, logger: logging.Logger,
                 concurrency: int = CONCURRENT_RECONCILES, wait: Wait = wait_woken) -> None:
        self._reconcile, self._log, self._wait = reconcile, logger, wait
        self._loops: dict[Hashable, JobLoop] = {}
        self._ending: dict[Hashable, asyncio.Task[Any]] = {}  # forgotten loops' tasks, until they have ended
        self._slots = asyncio.Semaphore(concurrency)

    def ensure(self, key: Hashable) -> JobLoop:
        """Wake the job's loop, starting it on first sight (after the name's forgotten loop, if any, has ended)."""
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = JobLoop(key=key)
            loop.task = asyncio.create_task(self._run(loop, self._ending.get(key)), name=f"reconcile {key}")
        loop.wake.set()
        return loop

    def wake(self, key: Hashable) -> None:
        if (loop := self._loops.get(key)) is not None:
            loop.wake.set()

    def forget(self, key: Hashable) -> Coroutine[Any, Any, None]:
        """End the job's loop now; returns what waits for its task to end. Now, not once that is awaited: a job
        deleted and created again under its name at once (both events handled before any other task runs) would
        otherwise find the old loop still there, wake it, and then lose it to the forget, never reconciled."""
        loop = self._loops.pop(key, None)
        task = loop.task if loop is not None else None
        if loop is not None:
            loop.forgotten = True
        if task is not None:
            task.cancel()
            self._ending[key] = task
        return self._ended(key, task)

    async def _ended(self, key: Hashable, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
            if self._ending.get(key) is task:
                del self._ending[key]

    async def stop_all(self) -> None:
        """Every loop cancelled before any is awaited: a loop cancelled while it held a slot would otherwise hand
        the slot to a waiting one, which would start a pass during the shutdown."""
        loops, self._loops = list(self._loops.values()), {}
        tasks = [loop.task for loop in loops if loop.task is not None] + list(self._ending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._loops)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._loops

    async def _run(self, loop: JobLoop, previous: asyncio.Task[Any] | None) -> None:
        if previous is not None:  # the name's earlier job: its last pass must not overlap this job's first
            await asyncio.gather(previous, return_exceptions=True)
        while not loop.forgotten:
            try:
                async with self._slots:
                    delay = await self._passes(loop)
                loop.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one job's surprise must not end its loop, nor touch the others
                delay = self._failed(loop, exc)
            await self._wait(loop.wake, delay)  # a wake meanwhile (news) runs it at once, backing off or not

    async def _passes(self, loop: JobLoop) -> float:
        """A pass that asks for another at once (0 s: it made the Service whose address the workers need) gets
        it in the same slot, up to FOLLOW_UPS more. Queued behind every other job instead, a fleet created at
        once had each job's workers made about 50 s after its first pass (1,000 jobs): the bare client makes
        them at once."""
        for _ in range(FOLLOW_UPS + 1):
            loop.wake.clear()  # after the wait for a slot: what came meanwhile is seen by this pass
            delay = await self._reconcile(loop)
            if delay > 0:
                break
        return delay

    def _failed(self, loop: JobLoop, exc: Exception) -> float:
        delay = float(backoff.step(backoff.RECONCILE_FAILED, loop.failures))
        loop.failures += 1
        if isinstance(exc, Failed):
            (exc.log or self._log).warning(f"reconcile failed ({loop.failures} in a row); retrying in {delay:g} s: "
                                           f"{exc}")
        else:
            self._log.exception(f"reconcile of {loop.key} failed ({loop.failures} in a row); retrying in {delay:g} s")
        return delay
