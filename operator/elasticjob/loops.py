"""One asyncio task per ElasticJob, woken by watch events; no finalizer needed.

kopf daemons would do this too, but they put a finalizer on every job: with the operator stopped or
uninstalled, deleting a job (or its namespace) would then hang. Owned pods need no finalizer (garbage
collection removes them), so the loops live here and end when the job's DELETED event arrives.
Many events between two reconciles coalesce into one wake-up, so the work per event stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

# Reconcile once with the job's latest body; returns the seconds after which to run again unwoken.
Reconcile = Callable[[dict[str, Any]], Awaitable[float]]


@dataclass
class JobLoop:
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class JobLoops:
    def __init__(self) -> None:
        self._loops: dict[Hashable, JobLoop] = {}

    def observe(self, key: Hashable, body: dict[str, Any], reconcile: Reconcile, logger: logging.Logger) -> None:
        """Record the job's latest state and wake its loop, starting it on first sight."""
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = JobLoop(body=body)
            loop.task = asyncio.create_task(self._run(loop, reconcile, logger), name=f"reconcile {key}")
        loop.body = body
        loop.wake.set()

    def wake(self, key: Hashable) -> None:
        if (loop := self._loops.get(key)) is not None:
            loop.wake.set()

    async def forget(self, key: Hashable) -> None:
        if (loop := self._loops.pop(key, None)) is not None and loop.task is not None:
            loop.task.cancel()
            await asyncio.gather(loop.task, return_exceptions=True)

    async def stop_all(self) -> None:
        for key in list(self._loops):
            await self.forget(key)

    def __len__(self) -> int:
        return len(self._loops)

    @staticmethod
    async def _run(loop: JobLoop, reconcile: Reconcile, logger: logging.Logger) -> None:
        while True:
            loop.wake.clear()
            try:
                delay = await reconcile(loop.body)
            except asyncio.CancelledError:
                raise
            except Exception:  # one job's surprise must not end its loop, nor touch the others
                logger.exception("reconcile failed; retrying in 5 s")
                delay = 5.0
            try:
                await asyncio.wait_for(loop.wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
