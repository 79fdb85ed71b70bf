"""The values around the tensors come back as they went in, with their types (elasticjob_ckpt keeps them in JSON,
tree.py): optimizers' and schedulers' state dicts exactly (int keys stay ints, tuples tuples, ints ints), every
value a checkpoint takes; a value it cannot hold is refused at save, by its place in the state, never pickled;
a tree in a file names no class that runs."""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
from collections import OrderedDict, defaultdict, namedtuple
from pathlib import Path

import pytest
import torch

from elasticjob_ckpt import Checkpointer, tree

Point = namedtuple("Point", "x y")


@pytest.fixture
def dirs(tmp_path):
    memory = Path(tempfile.mkdtemp(prefix="ckpt-test-", dir="/dev/shm" if Path("/dev/shm").is_dir() else tmp_path))
    yield tmp_path / "volume", memory
    shutil.rmtree(memory, ignore_errors=True)


def identical(left, right, path="state") -> None:
    """Equal, and of the same type at every level, keys included (1 == 1.0 == True for ==, not here)."""
    assert type(left) is type(right), (path, type(left), type(right))
    if isinstance(left, torch.Tensor):
        assert left.dtype == right.dtype and left.shape == right.shape and torch.equal(left, right), path
        assert left.requires_grad == right.requires_grad, path
    elif isinstance(left, dict):
        assert [(type(k), k) for k in left] == [(type(k), k) for k in right], path
        assert vars(left) == vars(right) if hasattr(left, "__dict__") else True, path
        for key in left:
            identical(left[key], right[key], f"{path}[{key!r}]")
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right)):
            identical(a, b, f"{path}[{index}]")
    elif isinstance(left, float) and math.isnan(left):
        assert math.isnan(right), path
    else:
        assert left == right, path


def trained(make_optim):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optim = make_optim(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.5)
    for _ in range(2):
        model(torch.ones(4, 8)).sum().backward()
        optim.step()
        optim.zero_grad()
        sched.step()
    return model, optim, sched


OPTIMIZERS = {
    "SGD with momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda params: torch.optim.Adam(params, lr=1e-3, betas=(0.8, 0.99), amsgrad=True),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=torch.tensor(1e-3)),
}


@pytest.mark.parametrize("new_pod, source", [(False, "memory"), (True, "volume")])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_optimizer_and_scheduler_state_round_trips_exactly(dirs, optimizer, new_pod, source):
    volume_dir, memory = dirs
    model, optim, sched = trained(OPTIMIZERS[optimizer])
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "sched": sched.state_dict()}
    assert isinstance(state["optim"]["param_groups"][0]["params"][0], int)
    saver = Checkpointer(volume_dir, memory_dir=memory, name="rank0")
    saver.save(state, 2)
    saver.wait()
    if new_pod:
        shutil.rmtree(memory)
    loaded = Checkpointer(volume_dir, memory_dir=memory, name="rank0").load()
    assert loaded.source == source
    identical(state, loaded.state)

    restored, restored_optim, restored_sched = trained(OPTIMIZERS[optimizer])
    restored.load_state_dict(loaded.state["model"])
    restored_optim.load_state_dict(loaded.state["optim"])
    restored_sched.load_state_dict(loaded.state["sched"])
    for run, run_optim in ((model, optim), (restored, restored_optim)):
        run(torch.ones(4, 8)).sum().backward()
        run_optim.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters()))


def module_state() -> OrderedDict:
    state = OrderedDict(w=torch.ones(2))
    state._metadata = OrderedDict({"": {"version": 1}})
    return state


VALUES = {
    "scalars": {"none": None, "true": True, "zero": 0, "one float": 1.0, "negative zero": -0.0, "big": 2**80,
                "small": 1e-300, "text": "é\u2028\ud800"},
    "non-finite floats": [math.inf, -math.inf, math.nan],
    "tuples stay tuples": ((0.9, 0.999), (), ((1,),), [(1, 2)]),
    "keys keep their types": {0: "int", "0": "str", 1.5: "float", True: "bool", None: "none", (1, "a"): "tuple",
                              b"k": "bytes"},
    "ordered dict with attributes": module_state(),
    "defaultdict": defaultdict(list, {"a": [1]}),
    "named tuple": Point(torch.zeros(1), (1, 2)),
    "bytes": b"\x00\xff",
    "torch values": [torch.Size([2, 0]), torch.Size([-1, 4]), torch.bfloat16, torch.device("cpu"), torch.device("cuda", 1)],
    "parameter": torch.nn.Parameter(torch.ones(2)),
}


@pytest.mark.parametrize("name", list(VALUES))
def test_a_value_keeps_its_type(name):
    tensors: list[torch.Tensor] = []
    encoded = tree.encode(VALUES[name], tensors)
    identical(VALUES[name], tree.decode(encoded, tensors))


def test_every_value_round_trips_through_a_file(dirs):
    saver = Checkpointer(*dirs, name="rank0")
    saver.save(VALUES, 1)
    saver.wait()
    loaded = Checkpointer(*dirs, name="rank0").load().state
    identical(VALUES, loaded)
    assert isinstance(loaded["named tuple"], Point) and loaded["defaultdict"]["new"] == []


class Thing:
    pass


class Floaty(float):
    pass


REFUSED = {
    "an object": ({"optim": {"param_groups": [{"lr": 0.1, "hook": Thing()}]}},
                  r"state\['optim'\]\['param_groups'\]\[0\]\['hook'\] is a test_ckpt_values.Thing"),
    "a float subclass": ({"loss": Floaty(0.5)}, r"state\['loss'\] is a test_ckpt_values.Floaty"),
    "a set": ({"seen": [{1, 2}]}, r"state\['seen'\]\[0\] is a set"),
    "a dict subclass": ({"d": type("Mine", (dict,), {})()}, r"state\['d'\] is a test_ckpt_values.Mine"),
    "a tensor as a key": ({"state": {torch.ones(1): 1}}, r"state\['state'\] has a key of type torch.Tensor"),
    "a defaultdict of a lambda": ({"d": defaultdict(lambda: 0)}, r"state\['d'\] is a defaultdict of <function"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_value_a_checkpoint_cannot_hold_is_refused_at_save(dirs, name):
    state, message = REFUSED[name]
    with pytest.raises(TypeError, match=message):
        Checkpointer(*dirs, name="rank0").save(state, 1)
    assert not dirs[0].exists() and not (dirs[1] / "rank0").exists()


def test_a_named_tuple_in_a_file_names_no_class_that_runs():
    """A class is taken only from a module already imported, only when it is a tuple of the same fields, and
    built with tuple.__new__: otherwise a new named tuple of the same fields."""
    node = {"t": "namedtuple", "module": "elasticjob_never_imported", "name": "Evil", "fields": ["a"], "items": [1]}
    value = tree.decode(node, [])
    assert value == (1,) and value.a == 1 and "elasticjob_never_imported" not in sys.modules
    assert type(tree.decode({**node, "module": "subprocess", "name": "Popen"}, [])).__name__ == "Popen"
    assert type(tree.decode({**node, "module": __name__, "name": "Point", "fields": ["x", "y"], "items": [1, 2]},
                            [])) is Point


@pytest.mark.parametrize("node, message", [
    ({"t": "pickle"}, "is not a value of a checkpoint"),
    ({"t": "tensor", "i": 3}, "tensor 3 is not one of the file's 0"),
    ({"t": "tensor", "i": True}, "not a int"),
    ({"t": "dict", "type": "Counter", "items": []}, "a dict of type 'Counter'"),
    ({"t": "dict", "type": "dict", "items": [[[1], 2]]}, "a key of type list"),
    ({"t": "dict", "type": "dict", "items": [], "attrs": {"t": "dict", "type": "dict", "items": []}},
     "attributes a dict does not take"),
    ({"t": "dict", "type": "defaultdict", "factory": "os.system", "items": []}, "a defaultdict of 'os.system'"),
    ({"t": "float", "v": "1e999"}, "a float '1e999'"),
    ({"t": "dtype", "name": "__class__"}, "no torch dtype is named"),
    ({"t": "size", "items": [2**64]}, r"a torch.Size of \[18446744073709551616\]"),
    ({"t": "namedtuple", "module": "m", "name": "N", "fields": ["a", "b"], "items": [1]}, "a named tuple of 1"),
    ({"t": "tuple", "items": [{"t": "tuple", "items": "ab"}]}, "'items' is not a list"),
])
def test_a_tree_node_encode_does_not_write_is_refused(node, message):
    with pytest.raises(ValueError, match=message):
        tree.decode(node, [])


def test_a_tree_nested_too_deep_is_refused():
    node: object = 0
    for _ in range(tree.MAX_DEPTH + 1):
        node = [node]
    with pytest.raises(ValueError, match="nested more than"):
        tree.decode(node, [])
