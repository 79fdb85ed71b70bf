"""Each rank's pace: how long its model's forward takes, told to the job's store so that the operator can see a
rank that is slower than the others (a throttled CPU, a GPU that clocks down, a node with a noisy neighbour).

Why the forward: in a data-parallel step every rank waits for the slowest in the gradients' all-reduce, so every
rank's step takes the same time, and the step time cannot tell which rank is slow. The forward of the model's own
module (under DistributedDataParallel, the module inside it: DDP's wrapper may broadcast buffers first) runs no
collective: its time is this rank's own speed. On a GPU it is timed with CUDA events (the CPU only queues the
kernels); on a CPU with the clock.

Every rank (not only rank 0) writes its own key, KEY_PREFIX + its global rank, every INTERVAL seconds once it
has MIN_SAMPLES forwards: the median of its latest WINDOW forwards, its pod, its world size. The store's process
reads them (elasticjob_store/pace.py checks every field; a unit test keeps the keys equal). It is the tenant's
word: the operator may replace a pod it names slow through a planned stop, uncharged, at most once per window.

Standard library only, and torch when a module is watched. Nothing here waits on the network in the training
loop: the hooks note a number; a daemon thread writes.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

KEY_PREFIX = "elasticjob.pace."
VERSION = 1
# The latest forwards the median is taken over, and the fewest worth a report. The first WARM_UP forwards of a
# process are left out: they set up autograd's and the allocator's caches (a replacement looked slow at its start).
WINDOW = 16
MIN_SAMPLES = 4
WARM_UP = 2
# Seconds between two writes: the operator decides over its own window (spec.stragglers.windowSeconds, 15 s
# and up), and a rank's report of 2 s ago is fresh enough for it.
INTERVAL = 2.0
# CUDA events not yet read by the writer, at most (one pair per forward; older ones are dropped).
MAX_PENDING = 256


def key(rank: int) -> str:
    return f"{KEY_PREFIX}{rank}"


class CpuTimer:
    """Times a forward with the process's clock: the work is done when the call returns."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._began: float | None = None

    def begin(self) -> None:
        self._began = self._clock()

    def end(self) -> float | None:
        began, self._began = self._began, None
        return None if began is None else self._clock() - began

    def done(self) -> list[float]:
        return []


class CudaTimer:
    """Times a forward with CUDA events on the current stream: the CPU only queues the kernels, so their time is
    read later (done()), by the writer thread, once the end event has passed. `event` makes one timing event."""

    def __init__(self, event: Callable[[], Any]) -> None:
        self._event = event
        self._began: Any = None
        self._pending: deque[tuple[Any, Any]] = deque(maxlen=MAX_PENDING)
        self._lock = threading.Lock()

    def begin(self) -> None:
        self._began = self._event()
        self._began.record()

    def end(self) -> float | None:
        began, self._began = self._began, None
        if began is not None:
            finished = self._event()
            finished.record()
            with self._lock:
                self._pending.append((began, finished))
        return None

    def done(self) -> list[float]:
        """The seconds of each timed forward whose end has passed on the GPU, in order."""
        seconds = []
        with self._lock:
            while self._pending and self._pending[0][1].query():
                began, finished = self._pending.popleft()
                seconds.append(began.elapsed_time(finished) / 1000.0)
        return seconds


def timer_for(module: Any) -> CpuTimer | CudaTimer:
    """CUDA events where the module's parameters are on a GPU, the clock otherwise."""
    parameter = next(iter(module.parameters()), None)
    if parameter is not None and parameter.device.type == "cuda":
        import torch

        return CudaTimer(lambda: torch.cuda.Event(enable_timing=True))
    return CpuTimer()


def inner(module: Any) -> Any:
    """The module DistributedDataParallel (or FSDP's wrapper) holds: its forward runs no collective of DDP's."""
    return getattr(module, "module", module)


class Pace:
    """One rank's forwards and the thread that writes their median. `connect` gives a store client (anything with
    set(key, value)); `rank`, `world` and `pod` name the report."""

    def __init__(self, connect: Callable[[], Any], *, rank: int, world: int, pod: str,
                 interval: float = INTERVAL, wall: Callable[[], float] = time.time) -> None:
        self._connect = connect
        self.rank, self.world, self.pod = rank, world, pod[:253]
        self._interval, self._wall = interval, wall
        self._samples: deque[float] = deque(maxlen=WINDOW)
        self._skipped = 0
        self._lock = threading.Lock()
        self._timer: CpuTimer | CudaTimer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0

    def watch(self, module: Any, timer: CpuTimer | CudaTimer | None = None) -> None:
        """Times each forward of `module` (the one inside DDP) from now on, and starts the writer."""
        target = inner(module)
        self._timer = timer or timer_for(target)
        target.register_forward_pre_hook(self._before)
        target.register_forward_hook(self._after)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="elasticjob-pace", daemon=True)
            self._thread.start()

    def _before(self, _module: Any, _args: Any) -> None:
        if self._timer is not None:
            self._timer.begin()

    def _after(self, _module: Any, _args: Any, _output: Any) -> None:
        if self._timer is not None:
            self.took(self._timer.end())

    def took(self, seconds: float | None) -> None:
        """One forward's time (None: read later, from the GPU's events)."""
        if seconds is None:
            return
        with self._lock:
            if self._skipped < WARM_UP:
                self._skipped += 1
                return
            self._samples.append(seconds)

    def report(self) -> dict[str, Any] | None:
        """What the next write says; None before MIN_SAMPLES forwards."""
        if self._timer is not None:
            for seconds in self._timer.done():
                self.took(seconds)
        with self._lock:
            samples = list(self._samples)
        if len(samples) < MIN_SAMPLES:
            return None
        return {"v": VERSION, "pod": self.pod, "rank": self.rank, "world": self.world,
                "seconds": round(statistics.median(samples), 6), "samples": len(samples),
                "sentAt": round(self._wall(), 3)}

    def write_once(self, store: Any) -> Any:
        """Writes the report, if there is one; returns the store client to reuse (None: reconnect next time)."""
        body = self.report()
        if body is None:
            return store
        try:
            store = store if store is not None else self._connect()
            if store is not None:
                store.set(key(self.rank), json.dumps(body, separators=(",", ":")).encode())
                self.writes += 1
            return store
        except Exception:  # noqa: BLE001 - a lost store costs reports, never the training; retried next time
            return None

    def close(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        store = None
        while not self._stop.wait(self._interval):
            store = self.write_once(store)
