"""Checkpoints in memory survive what they should and nothing loads wrong (elasticjob_ckpt): real worker
processes (tests/unit/ckpt_child.py) SIGKILLed after a save, in the middle of a persist to the volume, and in
the middle of a copy into memory; a new process on the same "pod" shares the memory directory, one on a new
pod gets an empty one."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CHILD = str(Path(__file__).with_name("ckpt_child.py"))


@pytest.fixture
def dirs(tmp_path):
    """The volume on disk, the memory in a tmpfs where there is one (as /dev/shm in a pod)."""
    shm = Path("/dev/shm")
    memory = Path(tempfile.mkdtemp(prefix="ckpt-test-", dir=shm)) if shm.is_dir() else tmp_path / "memory"
    yield tmp_path / "volume", memory
    shutil.rmtree(memory, ignore_errors=True)


def run(mode: str, volume: Path, memory: Path, arg: str = "0") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, CHILD, mode, str(volume), str(memory), arg], capture_output=True,
                          text=True, timeout=120)


def load(volume: Path, memory: Path) -> dict | None:
    done = run("load", volume, memory)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_worker_killed_after_save_returned_is_restored_from_memory(dirs):
    volume, memory = dirs
    worker = subprocess.Popen([sys.executable, CHILD, "save", str(volume), str(memory), "3"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "saved\n"
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.wait()
    shutil.rmtree(volume, ignore_errors=True)  # whether or not its persist ended: the memory copy is what counts
    assert load(volume, memory) == {"step": 3, "source": "memory", "equal": True}
    # The load wrote the memory copy the volume lacked behind it: a new pod now finds it there.
    shutil.rmtree(memory)
    assert load(volume, memory) == {"step": 3, "source": "volume", "equal": True}


def test_a_new_pod_loads_from_the_volume(dirs):
    volume, memory = dirs
    assert run("save-wait", volume, memory, "4").returncode == 0
    shutil.rmtree(memory)
    assert load(volume, memory) == {"step": 4, "source": "volume", "equal": True}


def test_nothing_saved_loads_nothing(dirs):
    assert load(*dirs) is None


def test_a_persist_killed_midway_leaves_the_last_complete_one(dirs):
    """Step 1 is persisted; the persist of step 2 is killed after 100 KiB of its 2 MiB. The volume holds
    step 1 and a partial file that nothing loads; the memory copy of step 2 was complete before the persist
    began, so the same pod resumes from it."""
    volume, memory = dirs
    killed = run("kill-persist", volume, memory, str(100 << 10))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = sorted(path.name for path in volume.iterdir() if path.name.endswith(".partial"))
    assert partial == ["rank0-step-000000000002.ejckpt.partial"], sorted(volume.iterdir())
    new_pod = memory.with_name(memory.name + "-new-pod")
    assert load(volume, new_pod) == {"step": 1, "source": "volume", "equal": True}
    assert load(volume, memory) == {"step": 2, "source": "memory", "equal": True}


def test_a_copy_into_memory_killed_midway_is_not_loaded(dirs):
    """The header says complete only once every tensor is in: after 1 of state(2)'s tensors the slot is not a
    checkpoint, and the same pod resumes from step 1 (in memory, as new as the volume's)."""
    volume, memory = dirs
    killed = run("kill-copy", volume, memory, "1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert load(volume, memory) == {"step": 1, "source": "memory", "equal": True}
