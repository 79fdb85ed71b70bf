"""A worker restart on a GPU, warm and plain: seconds from the failed workers' exit to the restarted workers'
first all_reduce on the device, for `python -m elasticjob_warm.torchrun` (the kit's launcher) and torchrun
itself, measured in one run. Needs a CUDA device (GPU_CHECK_ON_CPU=1 runs it with gloo on the CPU).

Usage: python bench/gpu_restart.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]
from tests.compat.gpu_scenarios import ON_GPU, backend_here, restart_once  # noqa: E402

LAUNCHERS = {"warm (elasticjob_warm.torchrun)": "elasticjob_warm.torchrun", "plain torchrun": "torch.distributed.run"}
SHAPES = {"nccl, 1 worker": ("nccl", 1), "gloo on CUDA, 2 workers": ("gloo", 2)}


def restart(tmp: Path, backend: str, nproc: int, launcher: str) -> float:
    restarted = restart_once(tmp, backend=backend_here(backend), nproc=nproc, launcher=launcher)
    if restarted.warm != (launcher == LAUNCHERS["warm (elasticjob_warm.torchrun)"]):
        raise SystemExit(f"{launcher}: warm is {restarted.warm}, not as expected:\n{restarted.log[-3000:]}")
    return restarted.seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not ON_GPU:
        print("no CUDA device: gloo on the CPU", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, (backend, nproc) in SHAPES.items():
            cells = {}
            for name, launcher in LAUNCHERS.items():
                seconds = [restart(Path(tmp) / f"{launcher}-{backend}-{i}", backend, nproc, launcher)
                           for i in range(args.runs)]
                cells[name] = seconds
                print(f"{shape}, {name}: {', '.join(f'{s:.2f}' for s in seconds)}", file=sys.stderr, flush=True)
            rows.append((shape, cells))
    names = list(LAUNCHERS)
    print(f"| workers | {' | '.join(names)} | warm / plain |\n|---|{'---|' * (len(names) + 1)}")
    for shape, cells in rows:
        medians = [statistics.median(cells[n]) for n in names]
        spans = [f"{m:.2f} [{min(cells[n]):.2f}-{max(cells[n]):.2f}]" for m, n in zip(medians, names)]
        print(f"| {shape} | {' | '.join(spans)} | {medians[0] / medians[1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
