"""The volume copy: `<name>-step-<step>.ejckpt` files in the script's checkpoint directory.

A file counts only once it is complete: it is written as `*.partial`, fsynced, renamed into place, and the
directory fsynced. A writer killed midway leaves a `.partial` that nothing loads (and the next writer of the
same name removes); the newest complete file stays what `load` finds.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from .files import Found, examine, fill, fsync_dir, make_dirs, open_private
from .layout import Header, Plan

SUFFIX = ".ejckpt"
PARTIAL = ".partial"
CHUNK = 64 << 20
log = logging.getLogger("elasticjob_ckpt")


def final_path(directory: Path, name: str, step: int) -> Path:
    return directory / f"{name}-step-{step:012d}{SUFFIX}"


def listing(directory: Path, name: str) -> list[tuple[int, Path]]:
    """This name's complete-looking files, newest step first."""
    pattern = re.compile(re.escape(name) + r"-step-(\d+)" + re.escape(SUFFIX) + "$")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(match.group(1)), directory / entry) for entry in names if (match := pattern.match(entry))]
    return sorted(found, reverse=True)


def newest(directory: Path, name: str) -> Found | None:
    for _step, path in listing(directory, name):
        found = examine(path)
        if found is not None:
            return found
        log.warning("elasticjob_ckpt: %s is not a complete checkpoint; skipped", path)
    return None


def copy_chunk(source: int, target: int, offset: int, count: int) -> int:
    """One piece of a persist, kernel to kernel. A function of its own so that a test can stop a persist midway."""
    return os.sendfile(target, source, offset, count)


def _publish(partial: Path, final: Path) -> None:
    os.replace(partial, final)
    fsync_dir(final.parent)


def persist(source: Path, header: Header, directory: Path, name: str) -> Path:
    """Copy a committed memory slot to the volume."""
    make_dirs(directory)
    final = final_path(directory, name, header.step)
    partial = final.with_name(final.name + PARTIAL)
    with open(source, "rb") as src, os.fdopen(open_private(partial, os.O_WRONLY | os.O_TRUNC), "wb") as dst:
        offset = 0
        while offset < header.total:
            sent = copy_chunk(src.fileno(), dst.fileno(), offset, min(CHUNK, header.total - offset))
            if sent <= 0:
                raise EOFError(f"elasticjob_ckpt: {source} ended at byte {offset} of {header.total}")
            offset += sent
        os.fsync(dst.fileno())
    _publish(partial, final)
    return final


def write_direct(plan: Plan, directory: Path, name: str, step: int, seq: int) -> Path:
    """Without a memory copy: the same file, written in the caller's time, as torch.save would."""
    make_dirs(directory)
    final = final_path(directory, name, step)
    partial = final.with_name(final.name + PARTIAL)
    fd = open_private(partial, os.O_RDWR | os.O_TRUNC)
    try:
        os.ftruncate(fd, plan.total)
        view = torch.from_file(str(partial), shared=True, size=plan.total, dtype=torch.uint8)
        fill(view, fd, plan, step, seq)
        del view  # unmapped; its pages are the page cache's, which fsync writes
        os.fsync(fd)
    finally:
        os.close(fd)
    _publish(partial, final)
    return final


def prune(directory: Path, name: str, keep: int) -> None:
    """Keep this name's `keep` newest checkpoints; drop older ones and any partial one left by a killed writer."""
    for _step, path in listing(directory, name)[keep:]:
        path.unlink(missing_ok=True)
    for path in directory.glob(f"{glob_escape(name)}-step-*{SUFFIX}{PARTIAL}"):
        path.unlink(missing_ok=True)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)
