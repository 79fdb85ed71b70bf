"""Checkpointer: save into memory and return, persist to the volume behind, load from the newer of the two."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from . import volume
from .files import fill, map_tensors, read_tensors
from .layout import Header
from .memory import Memory
from .record import plan, rebuild

MEMORY_ENV = "ELASTICJOB_CKPT_MEMORY_DIR"
DEFAULT_MEMORY = "/dev/shm/elasticjob-ckpt"
log = logging.getLogger("elasticjob_ckpt")


class Loaded(NamedTuple):
    state: Any  # the state dict as saved; every tensor a fresh CPU tensor the caller owns
    step: int
    source: str  # "memory" or "volume"


def default_name() -> str:
    """One memory copy per local worker: torchrun's LOCAL_RANK is what stays put when a worker restarts on the
    same pod (its global RANK may change with the world)."""
    return f"rank{os.environ.get('LOCAL_RANK', os.environ.get('RANK', '0'))}"


class Checkpointer:
    """`save` copies the state into memory that outlives the worker process (not the pod) and returns; a thread
    writes it to `directory` behind. `load` returns the newest complete checkpoint, from memory when it is at
    least as new as the volume's. One Checkpointer per `name` per pod at a time."""

    def __init__(self, directory: str | os.PathLike[str], memory_dir: str | os.PathLike[str] | None = None,
                 name: str | None = None, keep: int = 2) -> None:
        self.directory = Path(directory).absolute()
        self.name = name or default_name()
        base = memory_dir if memory_dir is not None else os.environ.get(MEMORY_ENV, DEFAULT_MEMORY)
        self.memory: Memory | None = Memory(Path(base) / self.name)
        self.keep = keep
        self.saves_waited = 0  # saves that found both slots busy and waited for the volume
        self._lock = threading.Condition()
        self._newest: int | None = None  # the slot holding the newest committed checkpoint
        self._pending: tuple[int, Header] | None = None  # the newest slot not yet on the volume
        self._busy: int | None = None  # the slot the thread is copying now
        self._error: BaseException | None = None
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._found_slots = False
        self._lent: set[int] = set()  # slots whose file a load's tensors map: replaced, never written, by a save
        self._size = 0  # the newest save's bytes: the other slot is allocated to it behind
        atexit.register(self.wait)

    # -- save

    def save(self, state_dict: Any, step: int) -> None:
        """Returns once the state is in memory (the stall); the volume copy follows. A save waits only when the
        save before it is still being persisted and the one before that too (saves faster than the volume)."""
        self._raise_error()
        laid_out = plan(state_dict, step, str(self.directory))
        self._find_slots()
        target = self._free_slot() if self.memory is not None else None
        if target is None or not self._reserve(laid_out.total, target):
            self._seq += 1
            volume.write_direct(laid_out, self.directory, self.name, step, self._seq)
            volume.prune(self.directory, self.name, self.keep)
            return
        assert self.memory is not None
        slot = self.memory.slots[target]
        assert slot.view is not None and slot.fd is not None
        self._seq += 1
        header = fill(slot.view, slot.fd, laid_out, step, self._seq)
        with self._lock:
            self._size = laid_out.total
            self._newest = target
            self._pending = (target, header)
            self._lock.notify_all()
        self._start_thread()

    def _free_slot(self) -> int:
        """The slot not holding the newest checkpoint, once the thread is not copying it to the volume."""
        with self._lock:
            target = 0 if self._newest is None else 1 - self._newest
            if self._busy == target:
                self.saves_waited += 1
                self._lock.wait_for(lambda: self._busy != target)
        return target

    def _reserve(self, size: int, target: int) -> bool:
        """False, once and logged, when memory cannot hold two copies: every save then goes straight to the volume."""
        assert self.memory is not None
        try:
            self.memory.reserve(size, target, renew=target in self._lent)
            self._lent.discard(target)
            return True
        except OSError as error:
            log.warning("elasticjob_ckpt: %s cannot hold 2 x %.1f MiB (%s); checkpoints go straight to %s from now "
                        "on (mount a memory emptyDir there for saves that return at once)",
                        self.memory.directory, size / 2**20, error.strerror or error, self.directory)
            with self._lock:  # the thread may still be copying a slot about to be removed
                self._lock.wait_for(lambda: self._pending is None and self._busy is None)
            self.memory.remove()
            self.memory = None
            return False

    def _find_slots(self) -> None:
        """What an earlier process on this pod left: the newest slot is not written over, sequence numbers go on."""
        if self._found_slots or self.memory is None:
            return
        self._found_slots = True
        committed = self.memory.committed(str(self.directory))
        if committed:
            self._newest = committed[0][0]
            self._seq = max(found.header.seq for _index, found in committed)

    # -- persist, on a thread

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._persist_loop, name="elasticjob-ckpt-persist", daemon=True)
            self._thread.start()

    def _persist_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending is not None)
                assert self._pending is not None
                index, header = self._pending
                self._pending, self._busy = None, 1 - index
            self._reserve_other(index)
            with self._lock:
                self._busy = index
                self._lock.notify_all()
            try:
                assert self.memory is not None
                volume.persist(self.memory.slots[index].path, header, self.directory, self.name)
                volume.prune(self.directory, self.name, self.keep)
            except BaseException as error:  # told to the script at its next save or wait
                log.error("elasticjob_ckpt: persisting step %d to %s failed: %s", header.step, self.directory, error)
                self._error = error
            with self._lock:
                self._busy = None
                self._lock.notify_all()

    def _reserve_other(self, index: int) -> None:
        """The slot the next save writes, allocated while it is marked busy (a save for it waits). A slot a load
        lent out is left to the save, which replaces its file; a failure too: the save's own allocation fails
        again and says so."""
        if self.memory is None or not self._size or (1 - index) in self._lent:
            return
        try:
            self.memory.reserve_other(self._size, index)
        except OSError:
            pass

    def wait(self, timeout: float | None = None) -> None:
        """Until the newest save is on the volume (fsynced and renamed into place); raises what the persist raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            done = self._lock.wait_for(lambda: self._pending is None and self._busy is None,
                                       None if deadline is None else max(0.0, deadline - time.monotonic()))
        if not done:
            raise TimeoutError(f"elasticjob_ckpt: the persist to {self.directory} still runs after {timeout} s")
        self._raise_error()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"elasticjob_ckpt: the last persist to {self.directory} failed") from error

    # -- load

    def load(self) -> Loaded | None:
        """The newest complete checkpoint, or None. From memory when it is at least as new as the volume's (a
        worker restarted on the same pod), else from the volume (a new pod). A memory copy newer than the
        volume's (its worker was killed before the persist ended) is persisted again, behind."""
        self.wait()
        self._find_slots()
        on_volume = volume.newest(self.directory, self.name)
        in_memory = self.memory.committed(str(self.directory)) if self.memory is not None else []
        if in_memory and (on_volume is None or in_memory[0][1].header.step >= on_volume.header.step):
            index, found = in_memory[0]
            if on_volume is None or found.header.step > on_volume.header.step:
                with self._lock:
                    self._pending = (index, found.header)
                    self._lock.notify_all()
                self._start_thread()
            self._lent.add(index)
            state = rebuild(found.record, map_tensors(found.path, found.record["entries"]))
            return Loaded(state, found.header.step, "memory")
        if on_volume is not None:
            state = rebuild(on_volume.record, read_tensors(on_volume.path, on_volume.record["entries"]))
            return Loaded(state, on_volume.header.step, "volume")
        return None

