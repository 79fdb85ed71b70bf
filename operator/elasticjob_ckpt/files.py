"""Reading and writing one checkpoint file (layout.py), in memory or on the volume alike."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .layout import HEADER, MAP_MIN, CheckpointError, Entry, Header, Plan, dtype_of
from .record import check_header, decode

PRIVATE_FILE = 0o600  # the bytes of a training state: the job's alone, in /dev/shm (shared by the pod's
PRIVATE_DIR = 0o700  # containers) as on the volume (perhaps mounted by other jobs)


class Found(NamedTuple):
    """A committed checkpoint file, its metadata decoded; its tensors not yet read."""

    path: Path
    header: Header
    record: dict[str, Any]


def read_header(fd: int) -> Header | None:
    return Header.unpack(os.pread(fd, HEADER.size, 0))


def write_header(fd: int, header: Header) -> None:
    os.pwrite(fd, header.pack(), 0)


def copy_tensor(dst: torch.Tensor, src: torch.Tensor) -> None:
    """One tensor into the file's mapping. A function of its own so that a test can stop a save midway."""
    dst.copy_(src.detach())


def fill(view: torch.Tensor, fd: int, plan: Plan, step: int, seq: int) -> Header:
    """Write a laid-out state dict into a mapped file (`view`: its bytes as uint8). The header goes last, so the
    file counts as a checkpoint only once every byte before it is there."""
    write_header(fd, Header(False, step, seq, 0, 0, 0))  # what the file held stops counting before it is overwritten
    for entry, tensor in zip(plan.entries, plan.tensors):
        if entry.nbytes:
            window = view[entry.offset:entry.offset + entry.nbytes]
            copy_tensor(window.view(tensor.dtype).view(tensor.shape), tensor)
    os.pwrite(fd, plan.meta, plan.meta_offset)
    header = Header(True, step, seq, plan.meta_offset, len(plan.meta), plan.total)
    write_header(fd, header)
    return header


def examine(path: Path) -> Found | None:
    """The checkpoint in `path` when it is a committed one whose every byte is there, else None. CheckpointError
    for a committed one that is not read: the old format, or metadata that does not hold for the file."""
    try:
        with open(path, "rb") as file:
            fd = file.fileno()
            header = read_header(fd)
            if header is None or not header.committed or header.total > os.fstat(fd).st_size:
                return None
            check_header(header, path)
            meta = os.pread(fd, header.meta_len, header.meta_offset)
    except OSError:
        return None
    if len(meta) != header.meta_len:
        return None
    return Found(path, header, decode(meta, header, path))


def _read_into(fd: int, tensor: torch.Tensor, entry: Entry) -> None:
    """Straight from the file into the tensor's memory: one copy, no numpy. The window is the tensor's own size,
    never a length from the file (decode checked they agree; this holds even if they did not)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes != entry.nbytes or not tensor.is_contiguous():
        raise CheckpointError(f"elasticjob_ckpt: an entry of {entry.nbytes} bytes for a tensor of {nbytes}")
    window = memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")
    done = 0
    while done < nbytes:
        count = os.preadv(fd, [window[done:]], entry.offset + done)
        if count == 0:
            raise EOFError(f"elasticjob_ckpt: the checkpoint ends {nbytes - done} bytes early")
        done += count


def read_tensors(path: Path, entries: list[Entry]) -> list[torch.Tensor]:
    """Fresh tensors, owned by the caller: nothing later written to the file changes them."""
    tensors = []
    with open(path, "rb") as file:
        for entry in entries:
            tensor = torch.empty(entry.shape, dtype=dtype_of(entry))
            if entry.nbytes:
                _read_into(file.fileno(), tensor, entry)
            tensors.append(tensor)
    return tensors


def map_tensors(path: Path, entries: list[Entry]) -> list[torch.Tensor]:
    """The tensors of a memory copy without copying them: each big one over a private (copy-on-write) mapping
    of its bytes, small ones read. The caller's writes stay its own; a later write to the file would show
    through pages the caller has not written, which is why a save never writes into a file it has lent out
    (the Checkpointer replaces it with a new one). The mapping lives as long as the tensor."""
    tensors = []
    with open(path, "rb") as file:
        for entry in entries:
            if entry.nbytes < MAP_MIN:
                tensor = torch.empty(entry.shape, dtype=dtype_of(entry))
                if entry.nbytes:
                    _read_into(file.fileno(), tensor, entry)
            else:
                pages = mmap.mmap(file.fileno(), entry.nbytes, access=mmap.ACCESS_COPY, offset=entry.offset)
                numel = entry.nbytes // dtype_of(entry).itemsize
                tensor = torch.frombuffer(pages, dtype=dtype_of(entry), count=numel).view(entry.shape)
            tensors.append(tensor)
    return tensors


def open_private(path: Path, flags: int) -> int:
    """A file only its owner reads, created so or made so (one an earlier writer left keeps its mode otherwise);
    not through a symlink someone put in its place."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        os.close(fd)
        raise
    return fd


def make_dirs(directory: Path) -> None:
    """`directory` and its missing parents, each 0700 (Path.mkdir(parents=True) gives the parents the default
    mode). Directories that exist are left as they are: they are someone's, a volume's mount point for one."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, PRIVATE_DIR)
        except FileExistsError:  # another rank's, made meanwhile
            pass


def fsync_dir(directory: Path) -> None:
    """A rename is durable only once the directory that holds it is."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
