"""A worker process for the elasticjob_ckpt tests: `python ckpt_child.py MODE VOLUME MEMORY [ARG]`.

MODE:
- save STEP: save state(STEP), print "saved", then wait for stdin to close (the test SIGKILLs it first);
- save-wait STEP: save state(STEP) and wait until it is on the volume;
- kill-persist BYTES: save state(1) and persist it, then save state(2) and SIGKILL itself once its persist wrote
  BYTES bytes to the volume;
- kill-copy TENSORS: save state(1), then SIGKILL itself after copying TENSORS tensors of state(2) into memory;
- load: print {"step", "source", "equal"}: what load found, and whether it equals state(step).

Where it stops is set by counting bytes or tensors in the real writer's own functions, not by timing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import torch

import elasticjob_ckpt
from elasticjob_ckpt import files, volume


def state(step: int) -> dict[str, Any]:
    """A torch.save-style dict: tensors big enough to be mapped on load (1 MiB and up) and small ones, plain
    values, a list."""
    return {"model": {"big": torch.full((512, 1024), float(step)), "small": torch.arange(10) * step},
            "step": step, "note": f"step {step}", "history": [float(step), torch.tensor([step])]}


def equal(left: Any, right: Any) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(equal(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return type(left) is type(right) and len(left) == len(right) and all(map(equal, left, right))
    return bool(left == right)


def kill_after(module: Any, function: str, limit: int, measure: Any) -> None:
    """Wrap module.function so that the process is SIGKILLed once `limit` units went through it."""
    real = getattr(module, function)
    done = [0]

    def wrapped(*args: Any) -> Any:
        result = real(*args)
        done[0] += measure(args, result)
        if done[0] >= limit:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(module, function, wrapped)


def main(mode: str, directory: str, memory: str, arg: str = "0") -> None:
    ckpt = elasticjob_ckpt.Checkpointer(directory, memory_dir=memory, name="rank0")
    if mode == "save":
        ckpt.save(state(int(arg)), int(arg))
        print("saved", flush=True)
        sys.stdin.read()
    elif mode == "save-wait":
        ckpt.save(state(int(arg)), int(arg))
        ckpt.wait()
    elif mode == "kill-persist":
        ckpt.save(state(1), 1)
        ckpt.wait()
        kill_after(volume, "copy_chunk", int(arg), lambda _args, sent: sent)
        ckpt.save(state(2), 2)
        ckpt.wait()
        raise SystemExit("the persist was not stopped")
    elif mode == "kill-copy":
        ckpt.save(state(1), 1)
        ckpt.wait()
        kill_after(files, "copy_tensor", int(arg), lambda _args, _result: 1)
        ckpt.save(state(2), 2)
        raise SystemExit("the copy was not stopped")
    elif mode == "load":
        loaded = ckpt.load()
        ckpt.wait()
        print(json.dumps(None if loaded is None else
                         {"step": loaded.step, "source": loaded.source, "equal": equal(loaded.state, state(loaded.step))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
