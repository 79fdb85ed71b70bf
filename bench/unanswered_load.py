"""False positives of the store's `Unanswered` evidence: a job that no fault touches, calm and then under CPU load.

The store takes an agent for cut off when its address answers none of the store's TCP (keep-alive probes or data)
for 0.5 s and its heartbeat is late (elasticjob_store/peers.py; planner/recovery.py books it `Unanswered`). A
kernel that is only slow, a starved process or a loaded node must never look like that: a false positive costs
the job a restart. Here nothing is cut off, so every agent taken out of the rendezvous is a false positive.

One job of 3 workers runs `examples/train_ddp.py` as most scripts are written (`--no-progress-api
--no-sigterm-save`: no steps reported to the store, so only the TCP evidence and the heartbeats can take an agent
out), with the operator's defaults, on the running local cluster. It trains calm for MINUTES, then for MINUTES
with this machine's CPUs (which every real node shares) saturated by LOAD busy processes. For each phase: rank 0's
steps, the longest wait between two of them, the agents taken out of the rendezvous (as `Unanswered`, or for
another reason), restarts and downtime incidents.

    make cluster-up && .venv/bin/python bench/unanswered_load.py [--minutes 4] [--load 6]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goodput_measure import parse_time  # noqa: E402
from harness import KIT_ARGS, STATE_DIR, Api, Operator, wait  # noqa: E402
from recovery import SCRIPT_FLAGS, manifest, records  # noqa: E402

JOB = "train"
WORKERS = 3
# The words of planner/recovery.py's reason for an agent whose address answered nothing (its Event's message).
UNANSWERED_WORDS = "answered none of the store's TCP"
BUSY = "while True: pass"


@dataclass
class Phase:
    name: str
    began: float
    ended: float = 0.0
    restarts_before: int = 0
    restarts_after: int = 0


def restarts(api: Api, ns: str) -> int:
    return int(api.status(ns, JOB).get("restarts") or 0)


def removals(api: Api, ns: str, phase: Phase) -> tuple[int, int]:
    """The agents taken out of the rendezvous in the phase: (as Unanswered, for another reason)."""
    unanswered = other = 0
    for event in api.core.list_namespaced_event(ns).items:
        when = event.event_time or event.last_timestamp or event.first_timestamp
        if event.reason != "RemovedFromRendezvous" or when is None:
            continue
        if phase.began <= when.timestamp() <= phase.ended:
            if UNANSWERED_WORDS in (event.message or ""):
                unanswered += 1
            else:
                other += 1
    return unanswered, other


def incidents(api: Api, ns: str, phase: Phase) -> int:
    booked = (api.status(ns, JOB).get("goodput") or {}).get("lastIncidents") or []
    return sum(phase.began <= parse_time(i["startTime"]) <= phase.ended for i in booked)


def steps(ns: str, phase: Phase) -> tuple[int, float]:
    """Rank 0's steps finished in the phase, and the longest wait between two of them."""
    times = sorted(r["time"] for r in records(ns) if r["rank"] == 0 and phase.began <= r["time"] <= phase.ended)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return len(times), max(gaps, default=0.0)


def run_phase(api: Api, ns: str, name: str, load: int, seconds: float) -> Phase:
    phase = Phase(name, time.time(), restarts_before=restarts(api, ns))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    try:
        time.sleep(seconds)  # the phase's length: the job trains on meanwhile, untouched
    finally:
        for process in busy:
            process.kill()
            process.wait()
    phase.ended = time.time()
    phase.restarts_after = restarts(api, ns)
    return phase


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="minutes per phase (default 4)")
    parser.add_argument("--load", type=int, default=6, help="busy processes in the loaded phase (default 6)")
    args = parser.parse_args()
    api = Api()
    api.install_crd()
    log = STATE_DIR / "bench-unanswered-load.log"
    with Operator(log, KIT_ARGS), api.namespace("bench-unanswered") as ns:
        api.create_job(ns, manifest(ns, {}, replicas=WORKERS, script_flags=tuple(SCRIPT_FLAGS["plain script"])))
        wait(lambda: {r["world_size"] for r in records(ns)} >= {WORKERS} or None, 240,
             f"a step at world size {WORKERS}")
        phases = [run_phase(api, ns, "calm", 0, args.minutes * 60),
                  run_phase(api, ns, f"{args.load} busy processes", args.load, args.minutes * 60)]
        print(f"\n{WORKERS} workers, a plain script, the operator's defaults; {args.minutes:g} minutes a phase; "
              f"nothing cut off (every removal is a false positive)\n")
        print("| phase | rank 0's steps | longest wait (s) | removed as Unanswered | removed otherwise | restarts "
              "| incidents |")
        print("|---|---|---|---|---|---|---|")
        for phase in phases:
            count, longest = steps(ns, phase)
            unanswered, other = removals(api, ns, phase)
            print(f"| {phase.name} | {count} | {longest:.2f} | {unanswered} | {other} "
                  f"| {phase.restarts_after - phase.restarts_before} | {incidents(api, ns, phase)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
