"""The store's seats for a job with spares (seats.py), on its poller's tick: the spares' asks read, the seats
freed and granted, the list the agents read written, and a forming round that holds every seat completed at once.
A part of Control (control.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timezone

from elasticjob_store import actions, compat, seats
from elasticjob_store.actions import Outcome
from elasticjob_store.agent_reports import Store
from elasticjob_store.state import RendezvousState


class Seating:
    """Control's seats; Control sets these attributes."""

    lock: threading.Lock
    _store_lock: threading.Lock
    _store: Store
    seats: seats.Seats
    seat_epoch: str
    _held_written: bytes
    verdict: compat.Verdict
    min_nodes: int
    max_nodes: int

    # Control's and AgentReports' own, ahead of these in Control's method order.
    def log(self, message: str) -> None: ...

    def read_keys(self, keys: list[str]) -> list[bytes]:
        raise NotImplementedError

    def apply(self, action: Callable[[RendezvousState | None], Outcome]) -> Outcome:
        raise NotImplementedError

    def set_seats(self, count: int | None) -> bool:
        """The operator's count of seats (replicas, for a job with spares; None: none). Whether it changed."""
        with self.lock:
            if count == self.seats.count:
                return False
            was, self.seats.count = self.seats.count, count
            if count is None:
                self.seats.waiting.clear()  # every agent joins now: the spares' next read of the seats says so
        self.log(f"seats: {was} -> {count}")
        return True

    def release_seat(self, addr: str) -> None:
        """The operator took the agent at `addr` out (dead, cut off or frozen, on its evidence): its seat frees now,
        not after ABSENT_GRACE, which only keeps a survivor's seat between its exit and its join."""
        with self.lock:
            if self.seats.release(addr):
                self.log(f"seat of the agent at {addr} freed: the operator took it out")

    def read_seats(self, state: RendezvousState | None, raw: bytes, now: float,
                   connected: set[str] | None) -> None:
        """The spares' new asks, then the seats: freed, granted, and written where the agents read them. A store
        without seats (a job without spares) only writes, once, that it hands out none."""
        with self.lock:
            on = self.seats.count is not None
        granted: list[str] = []
        if on:
            found = self._take_asks()
            # An unreadable state (a torch whose state is not read): the connections alone say who is there.
            present = seats.state_addresses(state) if state is not None or not raw else None
            with self.lock:
                for addr in found:
                    self.seats.asked(addr, now)
                granted = self.seats.update(present, connected, now)
        with self.lock:
            wire = seats.held_wire(self.seats.count, self.seats.held, self.seat_epoch)
        if wire != self._held_written:
            with self._store_lock:
                self._store.set(seats.HELD_KEY, wire)
            self._held_written = wire
        for addr in granted:
            self.log(f"seat granted to the spare at {addr}: it joins the next round")

    def _take_asks(self) -> list[str]:
        counted = self.read_keys([seats.COUNT_KEY])[0]
        with self.lock:
            slots = self.seats.slots(int(counted) if counted.strip().isdigit() else 0)
        keys = [seats.ask_key(slot) for slot in slots]
        found = []
        for key, value in zip(keys, self.read_keys(keys)):
            with self._store_lock:
                self._store.delete_key(key)
            addr = seats.address(value)
            if addr is not None:
                found.append(addr)
        return found

    def complete_seated(self, state: RendezvousState | None, now: float) -> None:
        """A forming round whose participants hold every seat is the job at its size: nobody else may join it, so
        its last call is ended now, in this tick, rather than after the operator's round trip (complete)."""
        with self.lock:
            count, held = self.seats.count, set(self.seats.held)
        if count is None or state is None or state.complete or state.closed or not self.verdict.nudges:
            return
        if len(state.participants) != count or not {seats.normal(n.addr) for n in state.participants} <= held:
            return
        when = datetime.fromtimestamp(now, timezone.utc)
        outcome = self.apply(lambda current: actions.complete_round(current, count, self.min_nodes, self.max_nodes,
                                                                    when))
        if outcome.done:
            self.log(f"round {state.round} holds every seat ({count}): {outcome.reason}")

