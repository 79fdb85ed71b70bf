"""The memory copy: two preallocated files per name in a tmpfs directory (by default /dev/shm, which lives as
long as the pod, not the worker process), each mapped once and reused by every save.

Two, so that a save never writes over the checkpoint the background thread is still copying to the volume, nor
over the newest complete one: a save goes into the slot that does not hold the newest checkpoint. A save allocates
only the slot it writes (allocating tmpfs costs about 0.25 s per GiB here); the other is checked to fit beside it
and allocated behind, by the thread that persists (Checkpointer).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import torch

from .files import Found, examine, make_dirs, open_private
from .layout import CheckpointError

SLOTS = 2
ROUND = 1 << 20  # slots grow in whole MiB, with one spare for the metadata of later saves


def rounded(size: int) -> int:
    """A slot's file size for `size` bytes: whole MiB, one spare."""
    return (size + 2 * ROUND - 1) // ROUND * ROUND


class Slot:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.view: torch.Tensor | None = None  # the whole file as uint8, mapped shared
        self.capacity = 0

    def held(self) -> int:
        """Bytes this slot's file holds now, open or not (an earlier process's)."""
        if self.fd is not None:
            return self.capacity
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def reserve(self, size: int) -> None:
        """Room for `size` bytes, really allocated (tmpfs files are sparse otherwise): OSError (ENOSPC) when the
        directory's filesystem cannot hold it."""
        if self.fd is None:
            self.fd = open_private(self.path, os.O_RDWR)
            self.capacity = os.fstat(self.fd).st_size
        if self.view is not None and size <= self.capacity:
            return
        self.view = None
        if size > self.capacity:
            wanted = rounded(size)
            os.posix_fallocate(self.fd, 0, wanted)
            self.capacity = wanted
        self.view = torch.from_file(str(self.path), shared=True, size=self.capacity, dtype=torch.uint8)

    def renew(self) -> None:
        """A new file in its place: the old one's pages stay with whoever maps them (a load's tensors) and go
        when they do; nothing written from now on reaches them."""
        self.close()
        self.path.unlink(missing_ok=True)
        self.capacity = 0

    def close(self) -> None:
        self.view = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Memory:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.slots = [Slot(directory / f"slot-{index}") for index in range(SLOTS)]

    def committed(self, volume: str) -> list[tuple[int, Found]]:
        """The slots that hold a complete checkpoint for this volume directory, newest first. A slot refused
        (CheckpointError: an old format, a file another container of the pod planted) is passed over, said on
        stderr, and overwritten by the next save: the volume still holds what was saved, and a slot is only ever
        a copy of it. Refusing the load instead would fail every rank of the job on a file in the pod's memory."""
        found = []
        for index, slot in enumerate(self.slots):
            try:
                held = examine(slot.path)
            except CheckpointError as refused:
                print(f"{refused}; the memory copy is passed over (the volume's is loaded)", file=sys.stderr,
                      flush=True)
                continue
            if held is not None and held.record.get("directory") == volume:
                found.append((index, held))
        return sorted(found, key=lambda item: (item[1].header.step, item[1].header.seq), reverse=True)

    def reserve(self, size: int, target: int, renew: bool = False) -> None:
        """The target slot, once both fit: a state that fits once but not twice would fail at the second save
        (OSError ENOSPC, as the allocation's own). `renew`: replace its file by a new one first (the old one is
        lent out). The other slot is allocated by reserve_other, behind."""
        make_dirs(self.directory)
        if renew:
            self.slots[target].renew()
        missing = sum(max(0, rounded(size) - slot.held()) for slot in self.slots)
        room = os.statvfs(self.directory)
        if missing > room.f_bavail * room.f_frsize:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.slots[target].reserve(size)

    def reserve_other(self, size: int, target: int) -> None:
        """The slot `target` is not: allocated now so that the next save finds it ready."""
        self.slots[1 - target].reserve(size)

    def remove(self) -> None:
        """Give the memory back (the memory copy is off): a tmpfs file's pages are held until it is unlinked."""
        for slot in self.slots:
            slot.close()
            try:
                slot.path.unlink()
            except FileNotFoundError:
                pass
