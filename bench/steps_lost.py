"""Steps lost per stop: how many training steps are done again after a stop the operator knew about, with and
without the progress API's planned stop, on the local cluster, in one run.

The job is `torchrun examples/train_ddp.py` at 3 pods, a step every 0.1 s, a checkpoint every 20 steps, run
three ways:
- progress API:  the example as it is: should_stop()/stopped() (elasticjob_progress), so before a scale-down the
                 operator has every rank stop after an agreed step and save it, and on an eviction the pod's
                 agent asks the same (elasticjob_warm/evicted.py);
- SIGTERM save:  --no-progress-api: the example's own SIGTERM handler finishes the step and saves it (what a
                 careful user writes by hand);
- plain script:  --no-progress-api --no-sigterm-save: SIGTERM ends the process where it is (most scripts).
Stops: a scale-down 3 -> 2 (the operator removes a worker it chose) and an eviction of a worker that is not rank
0 (the Eviction API, as `kubectl drain` does: the kubelet sends SIGTERM at once). Steps lost: the highest step
any rank of the old round completed minus the step the new round resumed from. Seconds without a step: the old
round's last step to the new round's first (a planned stop trains on to the agreed step first, so the time from
the stop itself would count training as lost). Each cell is the median [min-max] (runs).

    make cluster-up REAL_NODES=1 && .venv/bin/python bench/steps_lost.py [--runs 3] [--only scale-down]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kubernetes import client  # noqa: E402

from harness import KIT_ARGS, STATE_DIR, Api, Operator, median_range, wait  # noqa: E402
from recovery import drain, first_step_after, manifest, other_worker, real_nodes, records  # noqa: E402

STEP_SECONDS = 0.1
CHECKPOINT_EVERY = 20
LIMIT = 120.0
SETUPS = {"progress API": [], "SIGTERM save": ["--no-progress-api"],
          "plain script": ["--no-progress-api", "--no-sigterm-save"]}


def job(namespace: str, flags: list[str]) -> dict:
    found = manifest(namespace, {}, replicas=3, step_seconds=STEP_SECONDS, checkpoint_every=CHECKPOINT_EVERY)
    pod = found["spec"]["template"]["spec"]
    # The operator's grace where none is set: stopGraceSeconds + torchrun's 30 s, so a stop is not cut short.
    del pod["terminationGracePeriodSeconds"]
    pod["containers"][0]["command"] += flags
    return found


def scale_down(api: Api, ns: str) -> tuple[float, int | None]:
    when = time.time()
    api.scale(ns, "train", 2)
    return when, 2


def evict(api: Api, ns: str) -> tuple[float, int | None]:
    victim = other_worker(api, ns)
    when = time.time()
    api.core.create_namespaced_pod_eviction(victim, ns, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=victim, namespace=ns)))
    return when, None


STOPS = {"scale-down": scale_down, "eviction": evict}


def lost(ns: str, first: dict) -> tuple[int, float]:
    """Steps the old round completed past the checkpoint the new round resumed from, and the seconds from its
    last step to the new round's first (a planned stop trains on until the agreed step: that time is not lost)."""
    new = (first["host"], first["pid"], first["started"])
    old = [r for r in records(ns) if r["time"] <= first["time"] and (r["host"], r["pid"], r["started"]) != new]
    done = max((r["step"] for r in old), default=0)
    last = max((r["time"] for r in old), default=first["time"])
    return max(0, done - first["resumed_from"]), first["time"] - last


def run_once(api: Api, stop: str, flags: list[str]) -> tuple[int | None, float | None]:
    with api.namespace("bench-steps-lost") as ns:
        api.create_job(ns, job(ns, flags))
        # Past the first checkpoint and into the next interval, so a stop has steps to lose.
        wait(lambda: max((r["step"] for r in records(ns)), default=0) >= CHECKPOINT_EVERY + 10, 240, "step 30")
        when, world = STOPS[stop](api, ns)
        try:
            first = wait(lambda: first_step_after(ns, when, world), LIMIT, f"a step after the {stop}")
            return lost(ns, first)
        except TimeoutError:
            return None, None
        finally:
            drain(api, ns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated stops (default: scale-down,eviction)")
    args = parser.parse_args()
    if not real_nodes():
        sys.exit("steps_lost: needs the local cluster with real nodes (make cluster-up REAL_NODES=1)")
    stops = [s for s in STOPS if not args.only or s in args.only.split(",")]
    api = Api()
    api.install_crd()
    results: dict[tuple[str, str], list[tuple[int | None, float | None]]] = {}
    with Operator(STATE_DIR / "bench-steps-lost.log", KIT_ARGS):
        for i in range(args.runs):  # the setups interleaved, so the machine's load falls on each alike
            for stop in stops:
                for setup, flags in SETUPS.items():
                    steps, seconds = run_once(api, stop, flags)
                    results.setdefault((stop, setup), []).append((steps, seconds))
                    print(f"  run {i + 1} {stop:<10} {setup:<12} steps lost {steps}, no step for "
                          f"{'-' if seconds is None else f'{seconds:.1f}'} s", flush=True)
    print_table(stops, results)
    return 0


def print_table(stops: list[str], results: dict) -> None:
    print(f"\nsteps lost per stop (a step every {STEP_SECONDS} s, a checkpoint every {CHECKPOINT_EVERY}) and "
          "seconds without a step (the old round's last step to the new one's first): median [min-max] (runs)\n")
    header = ["stop", *(f"{s}: steps lost" for s in SETUPS), *(f"{s}: s without a step" for s in SETUPS)]
    rows = []
    for stop in stops:
        cells = [results.get((stop, s), []) for s in SETUPS]
        rows.append([stop, *(column(c, 0) for c in cells), *(column(c, 1) for c in cells)])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)))


def column(samples: list[tuple[int | None, float | None]], index: int) -> str:
    values = [s[index] for s in samples if s[index] is not None]
    missed = len(samples) - len(values)
    text = median_range([float(v) for v in values])
    return f"{text}, {missed} > {LIMIT:.0f} s" if missed else text


if __name__ == "__main__":
    sys.exit(main())
