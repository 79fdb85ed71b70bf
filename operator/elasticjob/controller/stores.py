"""One long-poll per running store: the job's loop wakes when its rendezvous changes (a round formed, a failure
round counted, a heartbeat went stale), not on a timer. A store that stops serving, or a job that ends, stops
its watch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from elasticjob import rendezvous_client
from elasticjob.controller.mirror import JobKey
from elasticjob.observe import StoreView
from elasticjob.planner import ControlAddress
from elasticjob.rendezvous_client import StoreClient

# (job uid, control address, maxReplicas): a store replaced at another address, a new job of the same name, or a
# new bound on the agents a reply may list, needs a new watch.
Target = tuple[str, ControlAddress, int]


class StoreWatches:
    def __init__(self, client: StoreClient, wake: Callable[[JobKey], None]):
        self._client, self._wake = client, wake
        self._watches: dict[JobKey, tuple[Target, asyncio.Task[Any]]] = {}
        self._views: dict[JobKey, tuple[Target, StoreView]] = {}

    def __len__(self) -> int:
        return len(self._watches)

    def view(self, key: JobKey, uid: str, address: ControlAddress, max_nodes: int) -> StoreView | None:
        """The store's latest state, watching it from now on; a reply listing more than `max_nodes` agents (the
        job's maxReplicas) is refused, and the last good one kept."""
        target = (uid, address, max_nodes)
        current = self._watches.get(key)
        if current is None or current[0] != target:
            self.stop(key)
            task = asyncio.create_task(rendezvous_client.watch(
                self._client, address.host, address.port, uid, lambda view: self._seen(key, target, view), max_nodes),
                name=f"store {key}")
            self._watches[key] = (target, task)
        seen = self._views.get(key)
        return seen[1] if seen is not None and seen[0] == target else None

    def stop(self, key: JobKey) -> None:
        if (current := self._watches.pop(key, None)) is not None:
            current[1].cancel()
        self._views.pop(key, None)

    def stop_all(self) -> None:
        for key in list(self._watches):
            self.stop(key)

    def _seen(self, key: JobKey, target: Target, view: StoreView) -> None:
        self._views[key] = (target, view)
        self._wake(key)
