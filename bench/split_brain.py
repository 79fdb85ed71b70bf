"""Split brain under randomized faults: never two worlds stepping at once.

One job (3 pods, 1..3 nodes) trains while a CPU hog keeps both cores busy, and faults come one after another in
random order: SIGKILL of a worker (rank 0 included), a partition of a worker, scale down or up, SIGKILL of the
store pod. After each the run waits for training to step again. From the training records (each step names its
world: rank 0's store for that round, `master`), two worlds whose steps overlap in time are a split brain.

    make cluster-up && .venv/bin/python bench/split_brain.py [--faults 30] [--seed N] [--cold]
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import KIT_ARGS, STATE_DIR, Api, Operator, wait  # noqa: E402
from recovery import drain, manifest, real_nodes, records  # noqa: E402

HOG = [sys.executable, "-c", "while True: pass"]


def worlds(found: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Each world's (first step time, last step time, world size). A world is rank 0's store (a random port
    per round) with the step all its ranks resumed from: two worlds share both only by a vanishing chance."""
    spans: dict[str, tuple[float, float, int]] = {}
    for r in found:
        if "master" not in r:
            continue
        world = f"{r['master']}/{r['resumed_from']}"
        first, last, size = spans.get(world, (r["time"], r["time"], r["world_size"]))
        spans[world] = (min(first, r["time"]), max(last, r["time"]), size)
    return spans


def overlaps(spans: dict[str, tuple[float, float, int]]) -> list[tuple[str, str]]:
    """Pairs of worlds that stepped at the same time."""
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    found = []
    for i, (a, (_, a_last, _)) in enumerate(ordered):
        for b, (b_first, _, _) in ordered[i + 1:]:
            if b_first < a_last:
                found.append((a, b))
    return found


def fault(api: Api, ns: str, rng: random.Random) -> str:
    from localcluster import faults, partition

    workers = [p for p in api.workers(ns, "train") if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    kind = rng.choice(["kill", "kill", "partition", "scale", "store"])
    if kind == "scale" or not workers:
        replicas = rng.choice([1, 2, 3])
        api.scale(ns, "train", replicas)
        return f"scale to {replicas}"
    if kind == "store":
        faults.kill_pod(ns, "train-rdzv", 9, STATE_DIR)
        return "kill store"
    victim = rng.choice(workers).metadata.name
    if kind == "partition":
        partition.partition(ns, victim, STATE_DIR)
        return "partition"
    faults.kill_pod(ns, victim, 9, STATE_DIR)
    return "kill worker"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--cold", action="store_true", help="spec.warmStarts: false (on real nodes the operator's "
                        "kit starts workers warm by default)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    api = Api()
    api.install_crd()
    done: Counter[str] = Counter()
    stalls = 0
    # A SIGTERM must reach the finally below, or the hogs outlive the bench and skew whatever runs next.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hogs = [subprocess.Popen(HOG) for _ in range(2)]
    try:
        kit = KIT_ARGS if real_nodes() else []
        warm = bool(kit) and not args.cold
        with Operator(STATE_DIR / "bench-split-brain.log", kit), api.namespace("bench-split") as ns:
            job = manifest(ns, {}, replicas=3, warm=warm)
            # Kills of a lone worker are failures and charged: at the default 3 the job failed by the tenth fault.
            job["spec"]["maxRestarts"] = 1000
            api.create_job(ns, job)
            wait(lambda: records(ns), 240, "the first step")
            for i in range(args.faults):
                at = time.time()
                done[fault(api, ns, rng)] += 1
                try:
                    wait(lambda: [r for r in records(ns) if r["time"] > at + 1], 120, "a step after the fault")
                except TimeoutError:
                    stalls += 1
                print(f"  fault {i + 1}/{args.faults}: {sum(done.values())} done", flush=True)
            found = records(ns)
            drain(api, ns)
    finally:
        for hog in hogs:
            hog.kill()
    spans = worlds(found)
    split = overlaps(spans)
    starts = "warm" if warm else "cold"
    print(f"\nsplit brain: seed {seed}, {sum(done.values())} faults with 2 CPU hogs, {starts} worker starts, "
          f"{len(found)} step records\n")
    print(f"{'fault':<14} {'count':>5}")
    for kind, count in sorted(done.items()):
        print(f"{kind:<14} {count:>5}")
    print(f"\n{'worlds formed':<38} {len(spans):>5}")
    print(f"{'faults after which training stalled':<38} {stalls:>5}")
    print(f"{'runs with two worlds stepping at once':<38} {len(split):>5}")
    for a, b in split[:5]:
        print(f"  {a} {spans[a]} overlaps {b} {spans[b]}")
    return 1 if split else 0


if __name__ == "__main__":
    sys.exit(main())
