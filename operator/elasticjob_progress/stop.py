"""Planned stops, the training's side: every rank learns "stop after step N" from the job's store, and reports
that it saved (elasticjob_store/stop.py writes the stop and picks N; a unit test keeps the keys equal).

Each rank's listener is a daemon thread that asks the store every POLL seconds for the count of stops and, when it
changed, whether the latest one's key exists (two short round trips), so it learns of a stop within POLL and costs
the training loop nothing: should_stop(n) only reads a number. Not the store's wait(): torch logs a warning at
each of its timeouts, and a thread left inside it at the interpreter's exit aborts the process; close() ends this
one within POLL. A stop applies to a process that stepped no later than its step: one that began after it (a
worker restarted from its checkpoint, which the stop's key outlives) ignores it.

Anyone who reaches the store's port may write these keys. The store writes stop n under the count its own add
returned, so the latest count's key is where its latest stop is, however far adds of others moved the count: the
count is read again at every poll and only that key is looked at, and only once it exists (a get of a missing
key waits for the store's timeout). A record is read once, at most MAX_BYTES of it is parsed, whatever it makes
the parser raise is no stop, and a stop already taken (its id) is not taken again: a count moved back to an
earlier stop's key does not replay that stop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

COUNT_KEY = "elasticjob.stops"
STOP_PREFIX = "elasticjob.stop."
DONE_PREFIX = "elasticjob.stopped."
POLL = 0.2
RECONNECT = 5.0
# The ids of the stops a listener took that it remembers, so as not to take one again.
TAKEN = 64
# The store's record is about 60 bytes (elasticjob_store/stop.py record()): anything longer is not its.
MAX_BYTES = 512


def parse(raw: bytes) -> tuple[str, int] | None:
    """(the stop's id, its step) from what the store wrote; None for anything else: too long, not JSON, or JSON
    that makes the parser raise (nesting too deep for it raises RecursionError), or not the store's record."""
    if not isinstance(raw, bytes) or len(raw) > MAX_BYTES:
        return None
    try:
        body = json.loads(raw)
    except Exception:  # noqa: BLE001 - a forged record is no stop, whatever it makes the parser raise
        return None
    if not isinstance(body, dict) or body.get("v") != 1:
        return None
    name, step = body.get("id"), body.get("step")
    if not isinstance(name, str) or len(name) > 32 or type(step) is not int or step < 0:
        return None
    return name, step


class Listener:
    """The latest stop of the job's store, as (id, step); None before any."""

    def __init__(self, connect: Callable[[], Any], stopping: threading.Event) -> None:
        self._connect = connect
        self._stopping = stopping
        self.latest: tuple[str, int] | None = None
        self.read: int | None = None  # the count whose key was read last (taken or refused): read once
        self._taken: list[str] = []  # the ids of the stops taken, the latest last
        self.store: Any = None
        self.connected = threading.Event()  # for tests: the listener reads the store
        self._thread = threading.Thread(target=self._run, name="elasticjob-stop", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception:  # noqa: BLE001 - a lost store costs the stop, never the training
                self.store, self.read = None, None  # a store that came back counts from 0 again
                self._stopping.wait(RECONNECT)

    def _listen(self) -> None:
        store = self.store = self.store if self.store is not None else self._connect()
        if store is None:
            self._stopping.wait(RECONNECT)
            return
        self._poll(store)  # the latest stop, asked before this process began
        self.connected.set()
        while not self._stopping.wait(POLL):
            self._poll(store)

    def _poll(self, store: Any) -> None:
        """The latest count's stop, once its key exists, if that count's key was not read already. A count that
        moved either way (adds of others) is followed: the store's next stop is under the count it then gets."""
        count = int(store.add(COUNT_KEY, 0))
        if count == self.read:
            return
        key = f"{STOP_PREFIX}{count}"
        if not store.check([key]):
            return  # none yet, or counted and not written yet: the store writes its stop right after its add
        self.read = count
        found = parse(store.get(key))
        if found is not None and found[0] not in self._taken:
            self.latest = found
            self._taken = [*self._taken, found[0]][-TAKEN:]
