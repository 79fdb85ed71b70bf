"""Checkpoints in memory, persisted behind: an optional helper for training scripts.

    from elasticjob_ckpt import Checkpointer
    ckpt = Checkpointer("/ckpt")                      # the job's volume; memory in /dev/shm/elasticjob-ckpt/rank<N>
    loaded = ckpt.load()                              # newest complete checkpoint: memory, else the volume, else None
    start = 0 if loaded is None else loaded.step + 1
    ...
    ckpt.save({"model": model.state_dict(), "optim": optim.state_dict()}, step)   # returns once in memory

`save` copies every tensor into one of two preallocated files of a tmpfs directory (memory.py: the pod's
/dev/shm by default, which a worker restart keeps and a new pod does not) and returns; a thread then copies
that file to the volume (volume.py: written as `*.partial`, fsynced, renamed, the directory fsynced). `load`
takes the memory copy when it is at least as new as the volume's, and always returns fresh CPU tensors the
caller owns. Where the tmpfs cannot hold two copies of the state (a pod's /dev/shm is 64 MiB unless a memory
emptyDir is mounted there) every save writes straight to the volume, as torch.save would; that is logged once.

State dicts: nested dicts, lists and tuples of dense tensors and plain values, as torch.save takes them and as
`torch.distributed.checkpoint.state_dict.get_state_dict` returns them for a model that is not sharded. DTensor
and ShardedTensor are out of scope (TypeError). Values other than tensors are kept in JSON with their types
(tree.py), never pickled: a value JSON cannot hold is refused at save (TypeError naming its place in the state).
Nothing in a checkpoint file runs code or sizes a write into memory: a file that does not hold up, or one of the
old pickled format, is refused at load (CheckpointError); see layout.py on trust.

Depends on torch and the standard library only; runs on the job image's Python (3.9 and up). It never imports
the operator, and the operator never imports it: the kit copies it into the job's pods (elasticjob_kit).
"""

from __future__ import annotations

import os
from typing import Any

from .checkpointer import Checkpointer, Loaded
from .layout import CheckpointError

__all__ = ["CheckpointError", "Checkpointer", "Loaded", "load", "save"]

_checkpointers: dict[tuple[str, str | None, str | None], Checkpointer] = {}


def _for(directory: str | os.PathLike[str], memory_dir: str | os.PathLike[str] | None,
         name: str | None) -> Checkpointer:
    key = (os.path.abspath(directory), None if memory_dir is None else os.fspath(memory_dir), name)
    if key not in _checkpointers:
        _checkpointers[key] = Checkpointer(directory, memory_dir=memory_dir, name=name)
    return _checkpointers[key]


def save(state_dict: Any, step: int, directory: str | os.PathLike[str],
         memory_dir: str | os.PathLike[str] | None = None, name: str | None = None) -> None:
    """`Checkpointer(directory, ...).save(state_dict, step)`, one Checkpointer per directory per process."""
    _for(directory, memory_dir, name).save(state_dict, step)


def load(directory: str | os.PathLike[str], memory_dir: str | os.PathLike[str] | None = None,
         name: str | None = None) -> Loaded | None:
    return _for(directory, memory_dir, name).load()
