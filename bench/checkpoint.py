"""Checkpoints in memory (elasticjob_ckpt) against torch.save, on this machine: `make bench-checkpoint`.

Per run, a worker process builds 1 GiB of state (8 float32 tensors of 128 MiB) and saves it three times with a
Checkpointer, waiting for each persist (a training loop saves every few minutes, not back to back), then once
with torch.save to the volume directory, fsynced. It is SIGKILLed, and a new process loads the state back and
copies it into a model's tensors (what load_state_dict does): from memory (a worker restarted on the same pod),
from our volume copy and with torch.load of the torch.save file (a new pod: the memory directory empty, the
files' pages dropped from the page cache with posix_fadvise, so the disk is read). Prints a table of medians
[min-max] over --runs runs. Memory: about 1 GiB of state plus 2 GiB in the memory directory (two copies), and
2 GiB in a loader.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TENSORS, ELEMENTS = 8, 32 << 20  # 8 x 128 MiB of float32
NAME = "rank0"


def state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {f"layer{index}.weight": torch.randn(ELEMENTS, generator=generator) for index in range(TENSORS)}


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def drop_cache(path: Path) -> None:
    """Read from the disk next time, as a new pod on another node would (not from this one's page cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def torch_save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    with open(path, "wb") as file:
        torch.save(tensors, file)
        file.flush()
        os.fsync(file.fileno())


def worker(volume: Path, memory: Path) -> None:
    from elasticjob_ckpt import Checkpointer

    tensors = state()
    ckpt = Checkpointer(volume, memory_dir=memory, name=NAME)
    result = {}
    for step in (1, 2, 3):
        result[f"save{step}"] = timed(lambda: ckpt.save(tensors, step))
        result[f"persist{step}"] = timed(ckpt.wait)
    result["saves_waited"] = ckpt.saves_waited
    result["torch_save"] = timed(lambda: torch_save(tensors, volume / "torch.pt"))
    print(json.dumps(result), flush=True)
    sys.stdin.read()  # until SIGKILLed


def loader(how: str, volume: Path, memory: Path) -> None:
    from elasticjob_ckpt import Checkpointer

    model = {key: torch.zeros(ELEMENTS) for key in state()}  # the restarted worker's model, built
    if how == "torch.load":
        drop_cache(volume / "torch.pt")
        start = time.perf_counter()
        loaded = torch.load(volume / "torch.pt", weights_only=True)
    else:
        if how == "volume":
            for path in volume.glob(f"{NAME}-step-*"):
                drop_cache(path)
        start = time.perf_counter()
        found = Checkpointer(volume, memory_dir=memory, name=NAME).load()
        assert found is not None and found.source == how, found
        loaded = found.state
    returned = time.perf_counter() - start
    for key, tensor in model.items():
        tensor.copy_(loaded[key])
    print(json.dumps({"returned": returned, "in_model": time.perf_counter() - start}), flush=True)


def child(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=stdin, stdout=subprocess.PIPE, text=True)


def one_run(volume: Path, memory: Path) -> dict[str, float]:
    shutil.rmtree(volume, ignore_errors=True)
    shutil.rmtree(memory, ignore_errors=True)
    volume.mkdir(parents=True)
    proc = child("--worker", str(volume), str(memory), stdin=subprocess.PIPE)
    assert proc.stdout is not None
    result: dict[str, float] = json.loads(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for how, memory_dir in (("memory", memory), ("volume", memory.with_name(memory.name + "-new-pod")),
                            ("torch.load", memory)):
        load = child("--load", how, str(volume), str(memory_dir))
        out, _ = load.communicate(timeout=300)
        assert load.returncode == 0, f"{how} loader exited {load.returncode}"
        for key, value in json.loads(out).items():
            result[f"{how} {key}"] = value
    return result


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def table(runs: list[dict[str, float]]) -> str:
    def col(key: str) -> list[float]:
        return [run[key] for run in runs]

    def ratio(top: str, bottom: str) -> float:
        return statistics.median(col(top)) / statistics.median(col(bottom))

    rows = [
        ("save stall, the first save of a process (allocates 1 GiB of tmpfs and maps it; the other copy behind)",
         cell(col("save1")), ""),
        ("save stall, the next save (first write into the second copy)", cell(col("save2")), ""),
        ("save stall, later saves", f"**{cell(col('save3'))}**",
         f"≤ 0.5 and ≤ 0.1× torch.save: {ratio('save3', 'torch_save'):.3f}×"),
        ("torch.save to the volume, fsynced", cell(col("torch_save")), ""),
        ("persist behind (memory → volume, fsynced, renamed; not a stall)", cell(col("persist3")), ""),
        ("load after a worker kill, from memory: load() returns", cell(col("memory returned")), ""),
        ("load after a worker kill, from memory: state in the model", f"**{cell(col('memory in_model'))}**",
         f"≥ 5× faster: {ratio('volume in_model', 'memory in_model'):.1f}× ours from the volume, "
         f"{ratio('torch.load in_model', 'memory in_model'):.1f}× torch.load"),
        ("new pod, our volume copy (cold page cache): state in the model", cell(col("volume in_model")), ""),
        ("new pod, torch.load of the torch.save file (cold page cache): state in the model",
         cell(col("torch.load in_model")), ""),
    ]
    lines = ["| 1 GiB of state (8 x 128 MiB float32) | seconds, median [min-max] | target |", "|---|---|---|"]
    lines += [f"| {what} | {value} | {target} |" for what, value, target in rows]
    waited = sum(run["saves_waited"] for run in runs)
    lines.append(f"\n{len(runs)} runs; saves that waited for a persist: {waited:.0f}")
    return "\n".join(lines)


def filesystem(path: Path) -> str:
    best = ("?", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        _source, point, kind = line.split()[:3]
        if str(path.resolve()).startswith(point) and len(point) >= len(best[1]):
            best = (kind, point)
    return best[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--volume", type=Path, help="the volume directory (default: a new one in /var/tmp)")
    parser.add_argument("--memory", type=Path, default=Path("/dev/shm/elasticjob-ckpt-bench"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(Path(args.worker[0]), Path(args.worker[1]))
    if args.load:
        return loader(args.load[0], Path(args.load[1]), Path(args.load[2]))
    volume = args.volume or Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir="/var/tmp"))
    print(f"volume {volume} ({filesystem(volume)}), memory {args.memory} ({filesystem(args.memory.parent)}), "
          f"{os.cpu_count()} cores, torch {torch.__version__}", file=sys.stderr)
    runs = []
    try:
        for index in range(args.runs):
            runs.append(one_run(volume / "ckpt", args.memory))
            print(f"run {index + 1}: " + json.dumps({k: round(v, 3) for k, v in runs[-1].items()}), file=sys.stderr)
    finally:
        shutil.rmtree(volume / "ckpt", ignore_errors=True)
        shutil.rmtree(args.memory, ignore_errors=True)
        shutil.rmtree(args.memory.with_name(args.memory.name + "-new-pod"), ignore_errors=True)
        if args.volume is None:
            shutil.rmtree(volume, ignore_errors=True)
    print(table(runs))


if __name__ == "__main__":
    main()
