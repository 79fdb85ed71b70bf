"""What the job's ranks and agents write into the store for the operator, read by the store's poller: each
rank's pace (pace.py), each agent's node check cost (nodechecks.py), the round's link probe verdict (links.py).
All of it is the tenant's word, checked field by field where it is read. A part of Control (control.py)."""

from __future__ import annotations

import threading
from typing import Protocol

from elasticjob_store import links, nodechecks, pace
from elasticjob_store.rounds import RoundTracker
from elasticjob_store.state import RendezvousState


class Store(Protocol):
    """The part of torch.distributed.Store used here."""

    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def compare_set(self, key: str, expected_value: bytes, desired_value: bytes) -> bytes: ...
    def add(self, key: str, value: int) -> int: ...
    def set(self, key: str, value: bytes) -> None: ...
    def delete_key(self, key: str) -> bool: ...


class AgentReports:
    """Control's reading of the ranks' and agents' keys; Control sets these attributes."""

    lock: threading.Lock
    _store_lock: threading.Lock
    _store: Store
    run_id: str
    tracker: RoundTracker
    pace: pace.PaceReader
    node_checks: nodechecks.NodeCheckReader
    links: links.LinkReader

    def read_pace(self, now: float, force: bool = False) -> None:
        """The ranks' pace keys, every pace.READ_EVERY seconds (`force`: now): rank 0's, then as many as its world
        names. Every report read at or before the latest round's completion is dropped: torchrun ended the
        processes that wrote it, and it would stand for the new ones of the same pods (a replacement too)."""
        with self.lock:
            if not self.pace.due(now) and not force:
                return
        done = 0
        for _ in range(2):  # a first read learns the world size from rank 0, a second reads the ranks past it
            with self.lock:
                ranks = self.pace.ranks()
            found = list(zip(ranks[done:], self.read_keys([pace.key(r) for r in ranks[done:]])))
            with self.lock:
                for rank, raw in found:
                    self.pace.take(rank, raw, now)
                began = max((r.completed_at for r in self.tracker.rounds), default=None)
                self.pace.forget_stale(now, began)
                if self.pace.ranks() == ranks:
                    return
            done = len(ranks)

    def read_keys(self, keys: list[str]) -> list[bytes]:
        """Each key's bytes; b"" for a key not there (get() would block until it is)."""
        with self._store_lock:
            return [self._store.get(key) if self._store.check([key]) else b"" for key in keys]

    def read_agents(self, state: RendezvousState | None, now: float) -> None:
        """What the latest round's agents said: their node checks' costs (nodechecks.py), their link probe's
        verdict (links.py)."""
        with self.lock:
            last = self.tracker.rounds[-1] if self.tracker.rounds else None
            addrs = self.node_checks.due(now, last.nodes if last else ())
            # Rounds too small to be probed write no verdict: not looked for at each tick for LINGER seconds.
            probed = last is not None and state is not None and state.round == last.round \
                and len(state.participants) >= links.MIN_AGENTS \
                and self.links.wanted(last.round, last.completed_at, now)
        keys = [nodechecks.key(addr) for addr in addrs]
        if probed and last is not None:
            keys.append(links.key(self.run_id, last.round))
        found = self.read_keys(keys) if keys else []
        with self.lock:
            for addr, raw in zip(addrs, found):
                self.node_checks.take(addr, raw)
            if probed and state is not None:
                self.links.take(found[-1], {rank: node.addr for node, rank in state.participants.items()})
