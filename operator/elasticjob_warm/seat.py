"""A warm spare's wait for a seat: with ELASTICJOB_SEATS=1 (a job with spec.spares), the agent asks the job's store
for a seat before each join of a round, and joins once it holds one (elasticjob_store/seats.py hands out as many
as the job's replicas). An agent without a seat is a spare: its warm server has imported torch, its node check
has passed, and it waits here, ready, until a seat frees (a worker's pod lost, cut off or replaced), then joins
the next round at once, so that the job restarts once, at its full size.

An agent that holds a seat (its address is in the store's list) joins at once: the survivors of a lost pod wait
for nothing here. A store that never lists seats (an older one) or lists none (count null) lets every agent join.
Each answer of the store counts for the pod's readiness probe (health.py): a spare is Ready while its store
answers. A store lost while a spare waits is waited for as outage.py waits for it (a new one at the same address).

Touches private names of torch's rendezvous handler: `_store`, `_this_node` and `_state_holder.sync`, checked where
used (without the first two the agent joins as plain torchrun would, and says so; without the last its join may
wait torch's spread of first joins, 0.3 s at most).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

ENV = "ELASTICJOB_SEATS"
# elasticjob_store.seats' keys (a unit test keeps them equal).
COUNT_KEY = "elasticjob.seat.count"
ASK_PREFIX = "elasticjob.seat.ask."
HELD_KEY = "elasticjob.seat.held"
POLL_SECONDS = 0.1
ASK_EVERY = 5.0  # elasticjob_store.seats.ASK_EVERY: the store forgets a spare it has not heard from in 3 of these
NO_LIST_AFTER = 10.0  # a store that has written no seat list by then hands out none (it predates seats): join


def log(message: str) -> None:
    print(f"elasticjob_warm.torchrun: {message}", file=sys.stderr, flush=True)


def normal(addr: str) -> str:
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return addr


def read_held(raw: bytes) -> tuple[str, int | None, tuple[str, ...]] | None:
    """(the store's epoch, the seats' count, who holds one) from the store's list; None for anything else."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("v") != 1 or not isinstance(body.get("epoch"), str):
        return None
    held, count = body.get("held"), body.get("count")
    if not isinstance(held, list) or not all(isinstance(a, str) for a in held):
        return None
    if count is not None and type(count) is not int:
        return None
    return body["epoch"], count, tuple(normal(a) for a in held)


class SeatWait:
    """One wait for a seat on `store` (a torch.distributed.Store) by the agent at `addr`."""

    def __init__(self, store: Any, addr: str, answered: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store, self.addr, self.answered = store, normal(addr), answered
        self.clock, self.sleep = clock, sleep
        self.asked: tuple[float, str] | None = None  # when, and in which store's epoch

    def run(self) -> str:
        """Blocks until the agent may join; returns why. Raises the store's errors."""
        started = self.clock()
        while True:
            found = read_held(self.store.get(HELD_KEY)) if self.store.check([HELD_KEY]) else None
            if found is None and self.clock() - started >= NO_LIST_AFTER:
                return "the store lists no seats"
            if found is not None:
                self.answered()
                epoch, count, held = found
                if count is None:
                    return "the job has no spares"
                if self.addr in held:
                    return "seated"
                self.ask(epoch)
            self.sleep(POLL_SECONDS)

    def ask(self, epoch: str) -> None:
        now = self.clock()
        if self.asked is not None and self.asked[1] == epoch and now - self.asked[0] < ASK_EVERY:
            return
        if self.asked is None:
            log(f"a warm spare: this agent ({self.addr}) waits for a seat in the job's rounds")
        slot = self.store.add(COUNT_KEY, 1)
        self.store.set(f"{ASK_PREFIX}{slot}", self.addr)
        self.asked = (now, epoch)


def wait_for_seat(handler: Any, answered: Callable[[], None]) -> None:
    """Before a join: returns once the agent holds a seat (or none are handed out)."""
    node = getattr(handler, "_this_node", None)
    addr = getattr(node, "addr", None) or os.environ.get("POD_IP")
    if getattr(handler, "_store", None) is None or not addr:
        log("this torch's rendezvous handler is not the one known: joining without a seat")
        return
    began = time.monotonic()
    while True:
        wait = SeatWait(handler._store, addr, answered)
        try:
            why = wait.run()
        except Exception as error:  # noqa: BLE001 - the store's errors: wait for it as outage.py does
            from elasticjob_warm.outage import Outage

            handler.__dict__.setdefault("_elasticjob_outage", Outage()).wait(handler, error)
            continue
        if wait.asked is not None:
            log(f"{why} after {time.monotonic() - began:.1f} s as a spare: joining the next round")
            _sync(handler)
        return


def _sync(handler: Any) -> None:
    """The handler's copy of the state, read now: a spare's is still the empty one of its start, round 0, and torch
    delays a join in round 0 by up to 0.3 s to spread a job's first joins (there, as it waited, nothing to spread)."""
    sync = getattr(getattr(handler, "_state_holder", None), "sync", None)
    if callable(sync):
        try:
            sync()
        except Exception:  # noqa: BLE001 - the join reads it again; a store lost now is its to handle
            pass


def apply(answered: Callable[[], None]) -> bool:
    """Patches the handler's next_rendezvous to wait for a seat first, where ELASTICJOB_SEATS=1; False where this
    torch's handler has none (the agent then joins as torchrun does)."""
    if os.environ.get(ENV) != "1":
        return True
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    handler: Any = getattr(rdzv, "DynamicRendezvousHandler", None)
    torch_next = getattr(handler, "next_rendezvous", None)
    if torch_next is None:
        return False
    if getattr(torch_next, "_elasticjob_seat", False):
        return True

    def next_rendezvous(self: Any) -> Any:
        wait_for_seat(self, answered)
        return torch_next(self)

    next_rendezvous._elasticjob_seat = True  # type: ignore[attr-defined]
    handler.next_rendezvous = next_rendezvous
    return True
