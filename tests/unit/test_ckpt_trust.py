"""A checkpoint file is data, never code (elasticjob_ckpt): a file planted on the volume or in the pod's /dev/shm
(which every container of the pod shares) runs nothing in load(), whether it is a pickle of the old format or
one dressed as the current one; an entry whose offset, length, dtype or shape does not hold for its file is
refused before any byte is read into memory; the files are the job's alone (0600, directories 0700)."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import torch

from elasticjob_ckpt import Checkpointer, CheckpointError, files, volume
from elasticjob_ckpt.layout import HEADER, HEADER_SIZE, MAGIC, Entry, Header


@pytest.fixture
def dirs(tmp_path):
    memory = Path(tempfile.mkdtemp(prefix="ckpt-test-", dir="/dev/shm" if Path("/dev/shm").is_dir() else tmp_path))
    yield tmp_path / "volume", memory
    shutil.rmtree(memory, ignore_errors=True)


class Payload:
    """What a planted pickle does when it is loaded: creates `marker` (a directory, so no shell is needed)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def planted(where: Path, version: int, meta: bytes, step: int = 5) -> None:
    """A committed checkpoint file of `version` whose metadata is `meta`, as its writer would leave it."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(HEADER.pack(MAGIC, version, 1, step, 1, HEADER_SIZE, len(meta), HEADER_SIZE + len(meta))
                      .ljust(HEADER_SIZE, b"\0") + meta)


def planted_path(dirs: tuple[Path, Path], place: str) -> Path:
    volume_dir, memory = dirs
    return volume.final_path(volume_dir, "rank0", 5) if place == "volume" else memory / "rank0" / "slot-0"


def refusal(dirs: tuple[Path, Path], place: str, capsys) -> str:
    """What loading says of the planted file: on the volume it is refused (the load raises: the job's own
    checkpoint is not there to load); in memory it is passed over, said on stderr, and the volume's loaded."""
    if place == "volume":
        with pytest.raises(CheckpointError) as refused:
            Checkpointer(dirs[0], memory_dir=dirs[1], name="rank0").load()
        return str(refused.value)
    loaded = Checkpointer(dirs[0], memory_dir=dirs[1], name="rank0").load()
    assert loaded is None, "nothing was saved on the volume: nothing loads"
    return capsys.readouterr().err


@pytest.mark.parametrize("place", ["volume", "memory"])
def test_an_old_format_checkpoint_is_refused_and_runs_nothing(dirs, tmp_path, place, capsys):
    """Version 1 kept its metadata as pickle.dumps({"tree", "entries", "step", "directory"}): a file in that
    format, planted, would have run its payload in every rank's load()."""
    marker = tmp_path / "ran"
    meta = pickle.dumps({"tree": Payload(marker), "entries": [], "step": 5, "directory": str(dirs[0].absolute())})
    planted(planted_path(dirs, place), 1, meta)
    said = refusal(dirs, place, capsys)
    assert not marker.exists(), "the planted pickle ran"
    assert "old-format checkpoint (version 1, metadata pickled): it is not read, because loading its metadata " \
           "could run code" in said
    pickle.loads(meta)  # the payload is live: what the refusal kept from running
    assert marker.is_dir()


@pytest.mark.parametrize("place", ["volume", "memory"])
def test_a_pickle_dressed_as_the_current_format_is_refused_and_runs_nothing(dirs, tmp_path, place, capsys):
    marker = tmp_path / "ran"
    planted(planted_path(dirs, place), 2, pickle.dumps(Payload(marker)))
    said = refusal(dirs, place, capsys)
    assert not marker.exists(), "the planted pickle ran"
    assert "the metadata is not a checkpoint's JSON" in said


def rewrite(path: Path, change) -> None:
    """Rewrite a checkpoint's metadata (a dict, the JSON record) with `change`, keeping the file consistent
    otherwise: as someone who can write the file would."""
    raw = path.read_bytes()
    header = Header.unpack(raw[:HEADER.size])
    record = json.loads(raw[header.meta_offset:header.total])
    change(record)
    meta = json.dumps(record).encode()
    new = dataclasses.replace(header, meta_len=len(meta), total=header.meta_offset + len(meta))
    path.write_bytes(new.pack().ljust(HEADER_SIZE, b"\0") + raw[HEADER_SIZE:header.meta_offset] + meta)


def entry(record: dict, index: int = 0, **fields) -> None:
    record["entries"][index].update(fields)


DATA_END = 4096 + (1 << 20)  # the saved state's data: one 1 MiB tensor at 4096, then 16 bytes
CORRUPT = {
    "offset past the data": lambda r: entry(r, 1, offset=DATA_END + 4096),
    "offset in the header": lambda r: entry(r, 1, offset=0),
    "length past the data, shape to match": lambda r: entry(r, 1, shape=[1 << 20], nbytes=4 << 20),
    "length beyond its shape": lambda r: entry(r, 1, nbytes=64),
    "length short of its shape": lambda r: entry(r, 0, nbytes=4096),
    "dtype not allowed": lambda r: entry(r, 1, dtype="qint8"),
    "dtype not a dtype": lambda r: entry(r, 1, dtype="__class__"),
    "negative size": lambda r: entry(r, 1, shape=[-4], nbytes=-16),
    "sizes whose product overflows": lambda r: entry(r, 1, shape=[0, 1 << 62, 4], nbytes=0),
    "size not an int": lambda r: entry(r, 1, shape=[4.0]),
    "mapped tensor off its page": lambda r: entry(r, 0, offset=4096 + 64),
    "not an entry": lambda r: r["entries"].__setitem__(1, [4096, "float32"]),
    "tensor index past the entries": lambda r: r["tree"]["items"][1][1].__setitem__("i", 2),
}


@pytest.mark.parametrize("source", ["memory", "volume"])
@pytest.mark.parametrize("corruption", list(CORRUPT))
def test_an_entry_that_does_not_hold_is_refused_before_any_read(dirs, monkeypatch, corruption, source, capsys):
    volume_dir, memory = dirs
    saver = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    saver.save({"big": torch.ones(1 << 18), "small": torch.arange(4, dtype=torch.float32)}, 5)  # 1 MiB: mapped
    saver.wait()
    if source == "volume":
        shutil.rmtree(memory)
    path = volume.final_path(volume_dir, "rank0", 5) if source == "volume" else memory / "rank0" / "slot-0"
    rewrite(path, CORRUPT[corruption])
    if source == "memory":  # passed over, said, and the volume's copy loaded instead
        loaded = Checkpointer(volume_dir, memory_dir=memory, name="rank0").load()
        said = capsys.readouterr().err
        assert loaded.source == "volume" and loaded.step == 5, said
        assert torch.equal(loaded.state["small"], torch.arange(4, dtype=torch.float32))
        assert re.search(f"{path}: (tensor entry|the metadata's state)", said) and "the file is not loaded" in said
        return
    monkeypatch.setattr(files, "_read_into", read_into_memory)
    monkeypatch.setattr(files.mmap, "mmap", read_into_memory)
    with pytest.raises(CheckpointError, match=f"{path}: (tensor entry|the metadata's state)") as refused:
        Checkpointer(volume_dir, memory_dir=memory, name="rank0").load()
    assert "the file is not loaded" in str(refused.value)


def read_into_memory(*args, **kwargs):
    raise AssertionError(f"a tensor was read from the file: {args}")


def test_the_unchanged_file_loads(dirs):
    """The corruptions above start from a file that loads: what refuses it is the change."""
    volume_dir, memory = dirs
    saver = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    saver.save({"big": torch.ones(1 << 18), "small": torch.arange(4, dtype=torch.float32)}, 5)
    saver.wait()
    rewrite(memory / "rank0" / "slot-0", lambda record: None)
    loaded = Checkpointer(volume_dir, memory_dir=memory, name="rank0").load()
    assert loaded.source == "memory" and torch.equal(loaded.state["small"], torch.arange(4, dtype=torch.float32))


def test_a_header_that_puts_the_metadata_in_the_data_is_refused(dirs):
    path = planted_path(dirs, "volume")
    planted(path, 2, b"{}")
    raw = bytearray(path.read_bytes())
    raw[:HEADER.size] = HEADER.pack(MAGIC, 2, 1, 5, 1, 64, 2, 66)
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="the header puts 2 bytes of metadata at 64"):
        files.examine(path)


def test_a_read_is_sized_by_the_tensor_not_by_the_file(tmp_path):
    """The last line of defence: even an entry that got past decode cannot size the ctypes window."""
    path = tmp_path / "data"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CheckpointError, match="an entry of 4096 bytes for a tensor of 16"):
            files._read_into(fd, torch.empty(4), Entry(4096, "float32", (4,), 4096, False, False))
    finally:
        os.close(fd)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("memory_copy", [True, False])
def test_files_and_directories_are_the_jobs_alone(dirs, memory_copy):
    """0600 files and 0700 directories wherever the library creates them, whatever the umask lets through."""
    volume_dir, memory = dirs
    volume_dir, memory = volume_dir / "run" / "nested", memory / "base"
    old = os.umask(0)
    try:
        ckpt = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
        if not memory_copy:
            ckpt.memory = None  # as after a memory too small for two copies: every save written straight
        for step in (1, 2):
            ckpt.save({"w": torch.ones(4)}, step)
            ckpt.wait()
    finally:
        os.umask(old)
    created = [volume_dir, volume_dir.parent, volume_dir.parent.parent]
    created += [memory, memory / "rank0"] if memory_copy else []
    assert {str(path): oct(mode(path)) for path in created} == {str(path): "0o700" for path in created}
    written = [path for directory in created for path in directory.iterdir() if path.is_file()]
    assert len(written) == (4 if memory_copy else 2)
    assert {str(path): oct(mode(path)) for path in written} == {str(path): "0o600" for path in written}


def test_files_an_earlier_writer_left_readable_are_made_private(dirs):
    volume_dir, memory = dirs
    (memory / "rank0").mkdir()
    (memory / "rank0" / "slot-0").touch(mode=0o644)
    volume_dir.mkdir()
    final = volume.final_path(volume_dir, "rank0", 1)
    final.with_name(final.name + ".partial").touch(mode=0o644)
    ckpt = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    ckpt.save({"w": torch.ones(4)}, 1)
    ckpt.wait()
    assert oct(mode(memory / "rank0" / "slot-0")) == "0o600"
    assert oct(mode(final)) == "0o600"
