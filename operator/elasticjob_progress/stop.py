"""Planned stops, the training's side: every rank learns "stop after step N" from the job's store, and reports
that it saved (elasticjob_store/stop.py writes the stop and picks N; a unit test keeps the keys equal).

Each rank's listener is a daemon thread that asks the store every POLL seconds whether the next stop's key exists
(check(): one short round trip), so it learns of a stop within POLL and costs the training loop nothing:
should_stop(n) only reads a number. Not the store's wait(): torch logs a warning at each of its timeouts, and a
thread left inside it at the interpreter's exit aborts the process; close() ends this one within POLL. A stop
applies to a process that stepped no later than its step: one that began after it (a worker restarted from its
checkpoint, which the stop's key outlives) ignores it.
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


def parse(raw: bytes) -> tuple[str, int] | None:
    """(the stop's id, its step) from what the store wrote; None for anything else."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
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
                self.store = None
                self._stopping.wait(RECONNECT)

    def _listen(self) -> None:
        store = self.store = self.store if self.store is not None else self._connect()
        if store is None:
            self._stopping.wait(RECONNECT)
            return
        seen = int(store.add(COUNT_KEY, 0))
        if seen:
            self._take(store.get(f"{STOP_PREFIX}{seen}"))  # the latest stop, asked before this process began
        self.connected.set()
        while not self._stopping.wait(POLL):
            key = f"{STOP_PREFIX}{seen + 1}"
            if store.check([key]):
                seen += 1
                self._take(store.get(key))

    def _take(self, raw: bytes) -> None:
        found = parse(raw)
        if found is not None:
            self.latest = found
