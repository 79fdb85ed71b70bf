"""A training script's progress, told to the ElasticJob operator: one call per step, one per checkpoint.

    import elasticjob_progress
    progress = elasticjob_progress.Progress()
    ...
    progress.loading()            # optional: a checkpoint load begins
    progress.loaded(step)         # the step the loaded checkpoint holds
    progress.watch(model)         # optional, every rank: times the model's forward, so a slow rank is seen
    for step in range(start, total):
        train_one_step()
        progress.step(step + 1)   # steps done so far
        if (step + 1) % every == 0 or progress.should_stop(step + 1):
            save()
            progress.saved(step + 1)
        if progress.should_stop(step + 1):   # every rank: a planned stop (scale-down, suspend, preemption,
                                             # an eviction or a node drain)
            progress.stopped(step + 1)        # every rank; holds the process until the operator ends it

watch (pace.py) is for every rank: each one tells the store how long its model's forward takes, and the operator
replaces a pod whose ranks are much slower than the others (spec.stragglers). should_stop and stopped (stop.py)
are for every rank: before the operator removes workers it chose to remove, it
has the job's store pick a step all ranks stop after, and waits (spec.runPolicy.stopGraceSeconds at most) until
every rank saved it; a worker restarted after it resumes from that step and none is done again. A script that
never asks should_stop is never waited for. The rest is a no-op outside a job (no torchrun rank, no
PET_RDZV_ENDPOINT, no torch) and on every rank but 0. On rank 0
the calls only note a number and a time; a daemon thread writes the latest report, at most twice a second, under
one key of the job's own rendezvous store (the c10d TCPStore the agents meet in, PET_RDZV_ENDPOINT), where the
store's process reads it and the operator shows it in the job's downtime ledger (status.goodput). Nothing here
waits on the network in the training loop: a lost store costs the thread its reports, never the script a step.

Standard library only, and torch's TCPStore when torch is there. Runs on the job image's Python (3.9 and up).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from elasticjob_progress import pace, stop
from elasticjob_progress.report import KEY, Report

__all__ = ["KEY", "Progress"]

# Twice a second: the store takes two intervals without a new report for a stall (every rank waits on a lost
# peer), and with a missed heartbeat that takes the peer out: at 1 s, a partition was noticed about 1 s later.
INTERVAL = 0.5
# How long a connection to the store or a write may take before the reporter gives up and tries again later.
STORE_TIMEOUT = 5.0
# At the interpreter's exit, the last report is given this long to go out.
EXIT_TIMEOUT = 1.0
# After stopped(), the process waits this long for the operator to end it (it removes the pods or restarts the
# group as soon as every rank stopped), then leaves with exit code STOP_EXPIRED_EXIT and one line on stderr: the
# group restarts from the checkpoint. An exit 0 would not do: torchrun's agents take it for the training's end and
# close the rendezvous. The code is the operator's sign (elasticjob/observe.py keeps the same number) that the
# training did nothing wrong: the stop it saved was not followed up (a stop written by someone who reached the
# store, or the operator's own, left unfinished), which it books StopExpired, not charged.
HOLD = 600.0
STOP_EXPIRED_EXIT = 85


def reporting_rank(environ: Mapping[str, str]) -> bool:
    """Global rank 0 of a torchrun job (RANK, else local rank 0 of group rank 0): one report per job."""
    rank = environ.get("RANK")
    if rank is not None:
        return rank == "0"
    return environ.get("GROUP_RANK") == "0" and environ.get("LOCAL_RANK") == "0"


def endpoint(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """The job's store (host, port) from PET_RDZV_ENDPOINT, which the operator sets on every worker container and
    torchrun's workers inherit; None when it is absent or unreadable."""
    value = environ.get("PET_RDZV_ENDPOINT", "")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def connect_store(host: str, port: int) -> Any:
    """A client of the job's TCPStore; raises when torch is missing or the store does not answer."""
    import torch.distributed

    dist: Any = torch.distributed  # TCPStore is not in its stubs
    store_type: Any = dist.TCPStore
    return store_type(host, port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT))


class Progress:
    """See the module's docstring. `store` (anything with set(key, value)) and `environ` are for tests and for
    scripts that run outside torchrun but know their store; `interval` is the least time between two writes."""

    def __init__(self, *, store: Any = None, environ: Mapping[str, str] | None = None,
                 interval: float = INTERVAL, clock: Callable[[], float] = time.time, hold: float = HOLD,
                 leave: Callable[[int], Any] = os._exit) -> None:
        env = os.environ if environ is None else environ
        self._world = _int(env.get("WORLD_SIZE")) or 1
        self._rank = _int(env.get("RANK"))
        self._pod = env.get("POD_NAME", "")
        self._pace: pace.Pace | None = None
        self._hold, self._leave = hold, leave
        self._first: int | None = None
        self._listener: stop.Listener | None = None
        self._clock = clock
        self._report = Report(pod=env.get("POD_NAME", "")[:253], started_at=clock(),
                              restart=_int(env.get("TORCHELASTIC_RESTART_COUNT")), interval=interval)
        address = endpoint(env)
        self.active = reporting_rank(env) and (store is not None or address is not None)
        self._connect: Callable[[], Any] = (lambda: store) if store is not None else \
            (lambda: connect_store(*address) if address else None)
        # Every rank listens for a planned stop, on a connection of its own (the listener blocks in wait()).
        self._listen_to: Callable[[], Any] | None = (lambda: connect_store(*address)) if address else \
            ((lambda: store) if store is not None else None)
        self._interval = interval
        self._wake = threading.Event()
        # The stop's report goes out at once, past the interval: the operator waits on it with every rank held.
        # Set by it and by close(), it also ends a pause under way.
        self._hurry = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.writes = 0
        self._thread: threading.Thread | None = None
        if self.active:
            self._thread = threading.Thread(target=self._run, name="elasticjob-progress", daemon=True)
            self._thread.start()
            atexit.register(self.close, EXIT_TIMEOUT)  # the last steps, when the script returns normally

    def step(self, n: int) -> None:
        """`n` steps done (the training's own step count, as checkpoints name it). Call it after every step."""
        if not self.active:
            return
        with self._lock:
            first = self._report.step_done(int(n), self._clock())
        if first:
            self._wake.set()  # the first step of this worker closes the operator's incident: tell it at once

    def watch(self, module: Any, interval: float = pace.INTERVAL) -> None:
        """Every rank, optional: times each forward of `module` (the model, or DDP holding it) and tells the store
        the median of the latest ones (pace.py), so that the operator sees a rank slower than the others. Once;
        a no-op outside a job. `interval`: the least time between two writes."""
        if self._pace is not None or self._listen_to is None:
            return
        self._pace = pace.Pace(self._listen_to, rank=self._rank, world=self._world, pod=self._pod,
                               interval=interval)
        self._pace.watch(module)

    def saved(self, n: int) -> None:
        """A checkpoint holding `n` steps is saved."""
        self._event(lambda now: self._report.saved_at(int(n), now))

    def loading(self) -> None:
        """Optional: a checkpoint load begins now (the ledger then splits worker start from checkpoint load)."""
        self._event(self._report.loading_at)

    def loaded(self, n: int) -> None:
        """A checkpoint holding `n` steps is loaded (0: none was found; the training starts afresh)."""
        self._event(lambda now: self._report.loaded_at(int(n), now))

    def should_stop(self, n: int) -> bool:
        """Whether the operator asked for a planned stop that step `n` (done) reached: then save, call
        saved(n) and stopped(n). Every rank gets the same answer for the same step. Only reads a number."""
        if self._listen_to is None:
            return False
        if self._first is None:
            self._first = int(n)
            self._listener = stop.Listener(self._listen_to, self._stop)
            if self._thread is None:
                atexit.register(self.close, EXIT_TIMEOUT)  # out of the store's wait() before the interpreter goes
            self._event(lambda _now: self._report.listening())  # rank 0: the operator may now ask
        agreed = self.stop_step()
        return agreed is not None and n >= agreed

    def stop_step(self) -> int | None:
        """The step of the planned stop that applies to this process; None when there is none. A stop whose
        step comes before this process's first step was for the process before it."""
        latest = self._listener.latest if self._listener is not None else None
        if latest is None or self._first is None or latest[1] < self._first:
            return None
        return latest[1]

    def stopped(self, n: int) -> None:
        """Every rank, after saving step `n` of a planned stop: tells the store this rank is done (rank 0 reports
        the stop once every rank is), then holds the process until the operator ends it. At most `hold`
        seconds: then the process leaves with exit code STOP_EXPIRED_EXIT and the group restarts from the
        checkpoint (closed meanwhile: exit code 1). Returns at once where no stop applies."""
        agreed = self.stop_step()
        latest = self._listener.latest if self._listener is not None else None
        if agreed is None or latest is None or self._listen_to is None:
            return
        deadline = time.monotonic() + self._hold
        try:
            done = self._listen_to()
            key = f"{stop.DONE_PREFIX}{latest[0]}"
            done.add(key, 1)
            while self.active and int(done.add(key, 0)) < self._world and time.monotonic() < deadline:
                time.sleep(0.05)  # polls the store, not a condition in this process: ranks are elsewhere
        except Exception:  # noqa: BLE001 - a lost store: the operator's grace ends the stop instead
            pass
        else:
            self._event(lambda now: self._report.stopped_at(int(n), now), urgent=True)
        if self._stop.wait(max(0.0, deadline - time.monotonic())):
            self._leave(1)
            return
        # The step, not the stop's id: the id is whatever the store held, and a line of it could read as another's.
        print(f"elasticjob_progress: the planned stop after step {int(n)} was not ended within {self._hold:g}s: "
              f"leaving with exit code {STOP_EXPIRED_EXIT} (StopExpired, not charged)", file=sys.stderr, flush=True)
        self._leave(STOP_EXPIRED_EXIT)

    def close(self, timeout: float = STORE_TIMEOUT) -> None:
        """Writes what is left and stops the threads. Called at the interpreter's exit too; a script that leaves
        by os._exit loses at most the last second of reports."""
        self._stop.set()
        self._hurry.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._listener is not None:
            self._listener.join(timeout)
        if self._pace is not None:
            self._pace.close(timeout)

    def _event(self, note: Callable[[float], None], urgent: bool = False) -> None:
        if not self.active:
            return
        with self._lock:
            note(self._clock())
        if urgent:
            self._hurry.set()
        self._wake.set()

    def _run(self) -> None:
        store, sent, last = None, -1, float("-inf")
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            pause = last + self._interval - time.monotonic()
            if pause > 0:
                self._hurry.wait(pause)  # at most one write per interval, whatever woke the thread
            self._hurry.clear()
            with self._lock:
                changes = self._report.changes
                body = json.dumps(self._report.wire(self._clock()), separators=(",", ":")).encode()
            if changes != sent:
                store, sent = self._write(store, body, changes, sent)
                last = time.monotonic()
            if self._stop.is_set():
                return

    def _write(self, store: Any, body: bytes, changes: int, sent: int) -> tuple[Any, int]:
        try:
            store = store if store is not None else self._connect()
            if store is None:
                return None, sent
            store.set(KEY, body)
            self.writes += 1
            return store, changes
        except Exception:  # noqa: BLE001 - a lost store costs reports, never the training; retried next time
            return None, sent


def _int(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0
