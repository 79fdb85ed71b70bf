"""What the progress API (elasticjob_progress) costs a training loop: steps of 100 ms (10 per second), with and
without `progress.step(n)` (and a checkpoint mark every 10 steps) reporting to a real TCPStore, as rank 0 does in
a job. Prints medians of several runs as a table.

    .venv/bin/python bench/progress_cost.py [--runs 5] [--steps 100] [--step-seconds 0.1]

A step is a busy wait of --step-seconds (the GIL held, as Python-side training holds it), so that the reporter
thread's work shows as lost step time, not hidden in a sleep.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

import torch.distributed as dist

import elasticjob_progress


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(steps: int, step_seconds: float, progress: elasticjob_progress.Progress | None) -> float:
    started = time.perf_counter()
    for n in range(1, steps + 1):
        busy(step_seconds)
        if progress is not None:
            progress.step(n)
            if n % 10 == 0:
                progress.saved(n)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=10))
    env = {"RANK": "0", "PET_RDZV_ENDPOINT": f"127.0.0.1:{store.port}", "POD_NAME": "bench"}
    plain, reported, writes = [], [], []
    for _ in range(args.runs):
        plain.append(run(args.steps, args.step_seconds, None))
        progress = elasticjob_progress.Progress(environ=env)
        reported.append(run(args.steps, args.step_seconds, progress))
        progress.close()
        writes.append(progress.writes)
    base, with_api = statistics.median(plain), statistics.median(reported)
    print(f"{args.steps} steps of {args.step_seconds * 1000:.0f} ms, {args.runs} runs each, medians")
    print("| loop | seconds | per step (ms) | store writes |")
    print("|---|---|---|---|")
    print(f"| without the API | {base:.3f} | {base / args.steps * 1000:.3f} | 0 |")
    print(f"| with progress.step every step, saved every 10 | {with_api:.3f} | "
          f"{with_api / args.steps * 1000:.3f} | {statistics.median(writes):.0f} |")
    print(f"cost: {100 * (with_api - base) / base:+.3f}%  (under 1% is the target)")
    per_call = min(reported) / args.steps - min(plain) / args.steps
    print(f"per step (best runs): {per_call * 1e6:+.1f} us")


if __name__ == "__main__":
    main()
