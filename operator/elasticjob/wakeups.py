"""Per-job wake-up signals: watch events set them, the job's reconcile loop waits on them.

Many events between two reconciles coalesce into one wake-up, so the work per event stays bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable


class Wakeups:
    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}

    def _event(self, key: Hashable) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def wake(self, key: Hashable) -> None:
        self._event(key).set()

    async def wait(self, key: Hashable, timeout: float) -> bool:
        """True when woken, False when the timeout passed first."""
        event = self._event(key)
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            event.clear()

    def forget(self, key: Hashable) -> None:
        self._events.pop(key, None)
