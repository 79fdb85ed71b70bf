"""What elasticjob_ckpt saves loads back equal, from memory and from the volume: torch.save-style dicts and the
state dicts of torch.distributed.checkpoint for a model that is not sharded; the tensors a load returns are the
caller's; a save while the previous persist still runs corrupts neither."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch
from ckpt_child import equal
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from elasticjob_ckpt import Checkpointer, files, volume
from helpers import wait_for

Pair = namedtuple("Pair", "first second")


@pytest.fixture
def dirs(tmp_path):
    memory = Path(tempfile.mkdtemp(prefix="ckpt-test-", dir="/dev/shm" if Path("/dev/shm").is_dir() else tmp_path))
    yield tmp_path / "volume", memory
    shutil.rmtree(memory, ignore_errors=True)


def plain_state() -> dict:
    weights = OrderedDict(w=torch.randn(600, 512), b=torch.randn(512))  # w: 1.2 MiB, mapped on load
    weights._metadata = OrderedDict({"": {"version": 1}})  # what load_state_dict reads back
    return {
        "model": weights,
        "dtypes": {str(dtype): torch.arange(6).to(dtype) for dtype in
                   (torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64)},
        "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3), "transposed": torch.arange(12.0).view(3, 4).t(),
        "param": torch.nn.Parameter(torch.ones(3)),
        "epoch": 7, "name": "run-1", "losses": [0.5, 0.25], "nested": [{"t": torch.ones(2)}, (1, torch.zeros(1))],
        "pair": Pair(torch.ones(1), "x"), "none": None,
    }


def reopen(volume_dir: Path, memory: Path, new_pod: bool) -> Checkpointer:
    """A new worker process's Checkpointer: on the same pod (same memory) or on a new one (memory wiped)."""
    if new_pod:
        shutil.rmtree(memory)
    return Checkpointer(volume_dir, memory_dir=memory, name="rank0")


@pytest.mark.parametrize("new_pod, source", [(False, "memory"), (True, "volume")])
def test_a_torch_save_style_dict_round_trips(dirs, new_pod, source):
    volume_dir, memory = dirs
    state = plain_state()
    saver = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    saver.save(state, 11)
    saver.wait()
    loaded = reopen(volume_dir, memory, new_pod).load()
    assert (loaded.step, loaded.source) == (11, source)
    assert equal(loaded.state, state)
    assert loaded.state["model"]._metadata == state["model"]._metadata
    assert isinstance(loaded.state["pair"], Pair) and isinstance(loaded.state["param"], torch.nn.Parameter)
    assert loaded.state["param"].requires_grad


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    model(torch.ones(4, 16)).sum().backward()
    optim.step()
    optim.zero_grad()


def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


@pytest.mark.parametrize("new_pod, source", [(False, "memory"), (True, "volume")])
def test_torch_distributed_checkpoint_state_dicts_round_trip(dirs, new_pod, source):
    """get_state_dict's model and optimizer dicts (nested dicts of tensors keyed by parameter name) in, the
    same out; set_state_dict takes them and the next step matches the uninterrupted run."""
    volume_dir, memory = dirs
    torch.manual_seed(0)
    model, optim = fresh()
    train_step(model, optim)
    model_sd, optim_sd = get_state_dict(model, optim)
    saver = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    saver.save({"model": model_sd, "optim": optim_sd}, 1)
    saver.wait()

    loaded = reopen(volume_dir, memory, new_pod).load()
    assert loaded.source == source and equal(loaded.state, {"model": model_sd, "optim": optim_sd})
    restored, restored_optim = fresh()
    set_state_dict(restored, restored_optim, model_state_dict=loaded.state["model"],
                   optim_state_dict=loaded.state["optim"])
    train_step(model, optim)
    train_step(restored, restored_optim)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters()))


def test_loaded_tensors_are_the_callers(dirs):
    """An optimizer keeps the tensors it is loaded with and writes into them: those writes must not reach the
    memory copy, and later saves must not reach those tensors, written to or only read."""
    volume_dir, memory = dirs
    saver = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    saver.save({"written": torch.zeros(1 << 20), "read": torch.zeros(1 << 20)}, 1)  # 4 MiB each: mapped on load
    saver.wait()
    worker = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    loaded = worker.load()
    assert loaded.source == "memory"
    written, read = loaded.state["written"], loaded.state["read"]
    written += 1
    assert Checkpointer(volume_dir, memory_dir=memory, name="rank0").load().state["written"].sum() == 0
    for step in (2, 3, 4):
        worker.save({"written": torch.full((1 << 20,), float(step)), "read": torch.full((1 << 20,), float(step))},
                    step)
    worker.wait()
    assert torch.equal(written, torch.ones(1 << 20)) and torch.equal(read, torch.zeros(1 << 20))
    assert torch.equal(worker.load().state["read"], torch.full((1 << 20,), 4.0))


def test_a_save_during_a_persist_corrupts_neither(dirs, monkeypatch):
    """The persist of step 1 is held; step 2 goes into the other slot at once; step 3 needs step 1's slot and
    waits for its persist. Every file on the volume then holds the values of its step."""
    volume_dir, memory = dirs
    release, real = threading.Event(), volume.copy_chunk

    def held_copy(*args):
        assert release.wait(60)
        return real(*args)

    monkeypatch.setattr(volume, "copy_chunk", held_copy)
    ckpt = Checkpointer(volume_dir, memory_dir=memory, name="rank0", keep=3)
    ckpt.save({"w": torch.full((1 << 19,), 1.0)}, 1)
    ckpt.save({"w": torch.full((1 << 19,), 2.0)}, 2)
    third = threading.Thread(target=ckpt.save, args=({"w": torch.full((1 << 19,), 3.0)}, 3))
    third.start()
    wait_for(lambda: ckpt.saves_waited, 30, "the third save to wait for the persist of the first", interval=0.01)
    assert third.is_alive()
    release.set()
    third.join(30)
    ckpt.wait()
    steps = {step: files.examine(path) for step, path in volume.listing(volume_dir, "rank0")}
    assert 1 in steps and 3 in steps
    for step, found in steps.items():
        (tensor,) = files.read_tensors(found.path, found.record["entries"])
        assert torch.equal(tensor, torch.full((1 << 19,), float(step))), step


def test_sparse_tensors_are_refused(dirs):
    with pytest.raises(TypeError, match="dense"):
        Checkpointer(dirs[0], memory_dir=dirs[1]).save({"s": torch.eye(3).to_sparse()}, 1)


def test_the_other_memory_copy_is_allocated_behind_the_first_save(dirs):
    """A save allocates only the slot it writes (about 0.25 s per GiB of tmpfs here): the other is ready for the
    next save once the first is persisted."""
    volume_dir, memory = dirs
    ckpt = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    ckpt.save({"w": torch.randn(300_000)}, 1)
    ckpt.wait()
    sizes = [(memory / "rank0" / f"slot-{index}").stat().st_size for index in (0, 1)]
    assert sizes[0] == sizes[1] >= 1_200_000, sizes
    ckpt.save({"w": torch.ones(300_000)}, 2)
    ckpt.wait()
    assert ckpt.saves_waited == 0
    loaded = reopen(volume_dir, memory, new_pod=False).load()
    assert (loaded.step, loaded.source) == (2, "memory") and torch.equal(loaded.state["w"], torch.ones(300_000))
