"""Recovery in seconds: fault -> next completed training step, on the local cluster, in one run.

Four ways of running the same job (`torchrun examples/train_ddp.py`, as users write it: 2 pods, 0.25 s steps,
checkpoint every 5):
- operator:       the defaults: the operator driving the rendezvous it hosts (planner/recovery.py), and on real
                  nodes warm worker starts through the operator's kit (kit.py: the operator runs with
                  --kit-image, as the chart does; process-backed nodes run no init containers, so no kit there);
- opt-out:        the same with spec.warmStarts: false (torchrun runs as written);
- no help:        the same rendezvous settings, the operator not touching the rendezvous, no warm starts;
- torch defaults: torch's own timeouts (keep-alive 5 s x 3, last call 30 s), no help;
- spares (not run unless asked, --modes spares): the defaults with one warm spare (spec.spares: 1);
- plain script (not run unless asked): the defaults, the script run with --no-progress-api --no-sigterm-save, as
                  most scripts are (no steps reported to the store, SIGTERM ends it where it is).
Faults: a container SIGKILLed (kill, kill-rank0, store: the kubelet restarts it in place), a pod deleted at
once (delete, delete-rank0, delete-store: grace 0, as a drain or an eviction; a new pod is made; delete-rank0-full:
to the first step at the full size again), a partition,
a scale down and up, and the start. The store's faults are measured as the longest pause in rank 0's steps (the
workers may train on through them: trained_through), the others as the first step of a new worker process.
Beside them, for the start-up: two torchrun agents and the store started by hand on this machine with the
operator's settings. Each cell is the median [min-max] (runs); the phases are medians of the operator runs.

    make cluster-up && .venv/bin/python bench/recovery.py [--runs 5] [--only kill,scale-down]
    .venv/bin/python bench/recovery.py --node-kinds real,process   # both kinds of node, one after the other

With --node-kinds the bench starts the local cluster with each kind of node in turn (stopping whatever runs),
and the table has a column per kind and mode; without it, it measures the running cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from handstart import hand_start  # noqa: E402
from harness import KIT_ARGS, ROOT, STATE_DIR, WORKER_IMAGE, Api, Operator, median_range, wait  # noqa: E402

HOST_DIR = Path("/tmp/elasticjob-bench")
STEP_SECONDS = 0.25
LIMIT = 90.0  # a recovery slower than this is reported as '> 90'
MODES = {  # name: (spec.rendezvous, the operator's flags, spec.warmStarts, the rest of the spec)
    "operator": ({}, [], True, {}),
    "plain script": ({}, [], True, {}),  # the defaults; the script's flags are in SCRIPT_FLAGS
    "spares": ({}, [], True, {"spares": 1}),  # the defaults and one warm spare (planner/spares.py)
    "opt-out": ({}, [], False, {}),
    "no help": ({}, ["--no-rendezvous-nudges"], False, {}),
    "torch defaults": ({"lastCallTimeoutSeconds": 30, "keepAliveIntervalSeconds": 5, "keepAliveMaxAttempts": 3},
                       ["--no-rendezvous-nudges"], False, {}),
}
SCRIPT_FLAGS = {"plain script": ["--no-progress-api", "--no-sigterm-save"]}
DEFAULT_MODES = ("operator", "opt-out", "no help", "torch defaults")
TARGETS = {"kill": "<= 5", "kill-rank0": "<= 5", "partition": "<= 5", "scale-down": "<= 4", "scale-up": "<= 6",
           "store": "<= 8", "start": "<= 1.3x by hand", "delete": "<= 5", "delete-rank0": "<= 3",
           "delete-store": "<= 4", "delete-rank0-full": "<= 2 with a spare", "partition-full": "<= 10"}


STORE_FAULTS = ("store", "delete-store")
# The table's phase columns, medians of the operator's runs; "store serving": the new store's process start to its
# port served, in its own log.
PHASES = ("agent removed", "round formed", "store serving")
AFTER_BACK = 3.0  # seconds of training looked at after the agents found the store again


@dataclass
class Sample:
    seconds: float | None
    phases: dict[str, float] = field(default_factory=dict)


def manifest(namespace: str, rendezvous: dict, replicas: int = 2, warm: bool = True,
             step_seconds: float = STEP_SECONDS, checkpoint_every: int = 5, extra: dict | None = None,
             script_flags: tuple[str, ...] = ()) -> dict:
    container = {"name": "worker", "image": WORKER_IMAGE, "command": [
        "torchrun", "/workspace/examples/train_ddp.py",
        "--steps", "100000", "--step-seconds", str(step_seconds),
        "--checkpoint-every", str(checkpoint_every), "--checkpoint-dir", "/ckpt", "--sigterm-grace", "1",
        *script_flags],
        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}
    return {"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob", "metadata": {"name": "train"},
            "spec": {"minReplicas": 1, "maxReplicas": 3, "replicas": replicas, "nprocPerNode": 1, "warmStarts": warm,
                     "rendezvous": rendezvous, "runPolicy": {"cleanPodPolicy": "All"}, **(extra or {}),
                     "template": {"spec": {"terminationGracePeriodSeconds": 5, "containers": [container],
                                           "volumes": [{"name": "ckpt", "hostPath": {
                                               "path": str(HOST_DIR / namespace), "type": "DirectoryOrCreate"}}]}}}}


def records(namespace: str) -> list[dict]:
    try:
        lines = (HOST_DIR / namespace / "progress.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            pass
    return found


def first_step_after(namespace: str, when: float, world: int | None = None) -> dict | None:
    """The first step by a worker process that wrote nothing before `when` (a survivor may finish its step)."""
    found = records(namespace)
    old = {(r["host"], r["pid"], r["started"]) for r in found if r["time"] <= when}
    later = [r for r in found if r["time"] > when and (r["host"], r["pid"], r["started"]) not in old
             and (world is None or r["world_size"] == world)]
    return min(later, key=lambda r: r["time"], default=None)


def rank0_host(namespace: str) -> str:
    return [r for r in records(namespace) if r["rank"] == 0][-1]["host"]


# --- faults -----------------------------------------------------------------------------------------------


def kill(api: Api, ns: str, rank0: bool) -> tuple[float, int | None]:
    from localcluster import faults

    victim = rank0_host(ns) if rank0 else other_worker(api, ns)
    when = time.time()
    faults.kill_pod(ns, victim, 9, STATE_DIR)
    return when, None


def kill_store(api: Api, ns: str) -> tuple[float, int | None]:
    """The rendezvous store's container SIGKILLed: the agents lose their TCPStore."""
    from localcluster import faults

    when = time.time()
    faults.kill_pod(ns, "train-rdzv", 9, STATE_DIR)
    return when, None


def delete(api: Api, ns: str, pod: str) -> tuple[float, int | None]:
    """The pod deleted at once (grace 0), as a drain past its grace or an eviction of a lost node does: the
    kubelet kills its containers and the pod object goes, so a replacement must be made, not restarted."""
    when = time.time()
    api.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
    return when, None


def other_worker(api: Api, ns: str) -> str:
    """A worker that trains (not a spare), other than rank 0's."""
    training = {r["host"] for r in records(ns)}
    return next(p.metadata.name for p in api.workers(ns, "train")
                if p.metadata.name != rank0_host(ns) and p.metadata.name in training)


def partition(api: Api, ns: str) -> tuple[float, int | None]:
    from localcluster import partition as cut

    victim = other_worker(api, ns)
    when = time.time()
    cut.partition(ns, victim, STATE_DIR)
    # Any world size: the survivor may train alone first, or the replacement may join before its first step
    # (asking for a world of one counted such runs as no recovery at all).
    return when, None


def scale(api: Api, ns: str, replicas: int) -> tuple[float, int | None]:
    when = time.time()
    api.scale(ns, "train", replicas)
    return when, replicas


FAULTS = {
    "kill": lambda api, ns: kill(api, ns, rank0=False),
    "kill-rank0": lambda api, ns: kill(api, ns, rank0=True),
    "partition": partition,
    "partition-full": lambda api, ns: (partition(api, ns)[0], 2),  # to the first step at the full size again
    "scale-down": lambda api, ns: scale(api, ns, 1),
    "scale-up": lambda api, ns: scale(api, ns, 3),
    "store": kill_store,
    "delete": lambda api, ns: delete(api, ns, other_worker(api, ns)),
    "delete-rank0": lambda api, ns: delete(api, ns, rank0_host(ns)),
    # The same, to the first step at the job's full size again: a spare's, or the replacement's after its start.
    "delete-rank0-full": lambda api, ns: (delete(api, ns, rank0_host(ns))[0], 2),
    "delete-store": lambda api, ns: delete(api, ns, "train-rdzv"),
}


# --- one run ----------------------------------------------------------------------------------------------


def run_once(api: Api, operator: Operator, scenario: str, rendezvous: dict, warm: bool,
             extra: dict | None = None, script_flags: tuple[str, ...] = ()) -> Sample:
    with api.namespace("bench-recovery") as ns:
        created = time.time()
        api.create_job(ns, manifest(ns, rendezvous, warm=warm, extra=extra, script_flags=script_flags))
        if scenario == "start":
            first = wait(lambda: first_step_after(ns, created), 180, "the first step")
            return Sample(first["time"] - created)
        wait(lambda: max((r["step"] for r in records(ns)), default=0) >= 7, 180, "step 7")
        fault_time, world = FAULTS[scenario](api, ns)
        try:
            if scenario in STORE_FAULTS:
                return trained_through(api, ns, fault_time)
            first = wait(lambda: first_step_after(ns, fault_time, world), LIMIT, f"a step after {scenario}")
            return Sample(first["time"] - fault_time, phases(api, operator, ns, fault_time, first["time"]))
        except TimeoutError:
            return Sample(None)
        finally:
            drain(api, ns)


def trained_through(api: Api, ns: str, fault: float) -> Sample:
    """A lost store: the workers train on without it, and their agents resume the round on the store that came
    back (elasticjob_warm/resume.py) or restart the workers in a new round there; torchrun without the kit exits
    and its pods restart. So not the first step of a new process (there may be none) but the longest pause
    between two of rank 0's steps, from its step before the fault until AFTER_BACK seconds after every agent
    found the store again, or the first step of a new process."""
    def settled() -> float | None:
        if (first := first_step_after(ns, fault)) is not None:
            return float(first["time"])
        logs = [api.core.read_namespaced_pod_log(p.metadata.name, ns) for p in api.workers(ns, "train")]
        return time.time() if logs and all("answers again" in log for log in logs) else None

    back = wait(settled, LIMIT, "the agents to find the store again")
    until = back + AFTER_BACK
    wait(lambda: any(r["rank"] == 0 and r["time"] >= until for r in records(ns)) or None, LIMIT,
         "rank 0 stepping after the store's return")
    times = sorted(r["time"] for r in records(ns) if r["rank"] == 0)
    marks = [max((t for t in times if t <= fault), default=fault), *(t for t in times if fault < t <= until)]
    restarted = first_step_after(ns, fault) is not None
    found = {"store back": back - fault, "new processes": 1.0 if restarted else 0.0}
    if (serving := store_serving(api, ns)) is not None:
        found["store serving"] = serving
    return Sample(max(b - a for a, b in zip(marks, marks[1:])), found)


def store_serving(api: Api, ns: str) -> float | None:
    """The new store's own word: seconds from its process's start to serving (elasticjob_store/main.py)."""
    try:
        log = api.core.read_namespaced_pod_log("train-rdzv", ns)
    except Exception:  # noqa: BLE001 - a store not there (yet) says nothing
        return None
    said = re.findall(r"serving (\d+\.\d+) s after its process started", log)
    return float(said[-1]) if said else None


def drain(api: Api, ns: str) -> None:
    """Stop the job and let its processes go, so that the next run gets the CPUs."""
    from kubernetes.client.exceptions import ApiException

    from localcluster import partition as cut

    for pod in api.workers(ns, "train"):
        try:
            cut.heal(ns, pod.metadata.name, STATE_DIR)
        except ApiException as error:
            if error.status != 404:  # a pod that left between the list and the heal (a scale-down's) has no cut
                raise
    api.custom.delete_namespaced_custom_object("elasticjob.dev", "v1alpha1", ns, "elasticjobs", "train")
    wait(lambda: not api.core.list_namespaced_pod(ns).items, 90, "the job's pods gone", interval=0.5)


def phases(api: Api, operator: Operator, ns: str, fault: float, step: float) -> dict[str, float]:
    """When, after the fault, the operator acted and the store saw the next round form."""
    found = {}
    removed = event_times(operator.log(), ns, ("RemovedFromRendezvous", "Partitioned"))
    if after := [t for t in removed if t > fault]:
        found["agent removed"] = min(after) - fault
    try:
        store_log = api.core.read_namespaced_pod_log("train-rdzv", ns)
    except Exception:  # the store pod may be gone with the job
        store_log = ""
    if rounds := [t for t in store_times(store_log, "formed") if fault < t <= step]:
        found["round formed"] = min(rounds) - fault
    return found


def event_times(log: str, namespace: str, reasons: tuple[str, ...]) -> list[float]:
    times = []
    for line in log.splitlines():
        if f"[{namespace}/train]" in line and any(f"] {r}:" in line for r in reasons):
            stamp = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]", line)
            if stamp:
                times.append(datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


def store_times(log: str, word: str) -> list[float]:
    return [datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
            for line in log.splitlines() if word in line and line[:4].isdigit()]


# --- the table --------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated modes of {', '.join(MODES)} (default: {', '.join(DEFAULT_MODES)})")
    parser.add_argument("--node-kinds", default="",
                        help="real,process: start the local cluster with each kind of node in turn (default: the "
                             "running cluster, as it is)")
    args = parser.parse_args()
    scenarios = [s for s in [*FAULTS, "start"] if not args.only or s in args.only.split(",")]
    modes = [m for m in MODES if m in args.modes.split(",")]
    kinds = [k for k in args.node_kinds.split(",") if k] or [""]
    results: dict[tuple[str, str], list[Sample]] = {}
    columns = []
    for kind in kinds:
        if kind:
            start_cluster(kind)
        for mode in modes:
            column = f"{kind} {mode}".strip()
            columns.append(column)
            measure(column, MODES[mode], tuple(SCRIPT_FLAGS.get(mode, ())), scenarios, args.runs, results)
    hand = hand_start(args.runs) if "start" in scenarios else []
    print_table(scenarios, columns, results, hand)
    return 0


def start_cluster(kind: str) -> None:
    """The local cluster with `kind` nodes: whatever runs is stopped first unless it already has that kind."""
    from localcluster import controlplane, faults

    if controlplane.is_up(ROOT) and faults.nodes(STATE_DIR).name != kind:
        controlplane.stop(ROOT)
    controlplane.ensure_up(ROOT, node_kind=kind)


def real_nodes() -> bool:
    from localcluster import faults

    return faults.nodes(STATE_DIR).name == "real"


def measure(column: str, mode: tuple, script_flags: tuple[str, ...], scenarios: list[str], runs: int,
            results: dict) -> None:
    rendezvous, flags, warm, extra = mode
    api = Api()
    api.install_crd()
    log = STATE_DIR / f"bench-recovery-{column.replace(' ', '-').replace('+', '-')}.log"
    kit = KIT_ARGS if real_nodes() else []
    with Operator(log, [*kit, *flags]) as operator:
        for scenario in scenarios:
            # A fault that torch alone never recovers from (a partition) is measured once without the operator.
            times = 1 if scenario == "partition" and "--no-rendezvous-nudges" in flags else runs
            for i in range(times):
                sample = run_once(api, operator, scenario, rendezvous, warm, extra, script_flags)
                results.setdefault((scenario, column), []).append(sample)
                print(f"  {column:>20} {scenario:<11} run {i + 1}: "
                      f"{f'> {LIMIT:.0f}' if sample.seconds is None else f'{sample.seconds:.1f}'} s "
                      f"{ {k: round(v, 2) for k, v in sample.phases.items()} }", flush=True)


def cell(samples: list[Sample]) -> str:
    done = [s.seconds for s in samples if s.seconds is not None]
    if not done:
        return f"> {LIMIT:.0f}" if samples else "-"
    text = median_range(done)
    return text if len(done) == len(samples) else f"{text}, {len(samples) - len(done)} > {LIMIT:.0f}"


def print_table(scenarios: list[str], modes: list[str], results: dict, hand: list[float]) -> None:
    print("\nfault -> next completed step (store, delete-store: the longest pause in rank 0's steps), seconds: "
          "median [min-max] (runs)\n")
    header = ["fault", *modes, "by hand", "target", *PHASES]
    rows = []
    for scenario in scenarios:
        # The phases of one mode: the first of the operator's that ran, never two mixed.
        ours = next((got for m in modes if m.endswith("operator")
                     if (got := results.get((scenario, m)))), [])
        phase = {name: statistics.median(vals) for name in PHASES
                 if (vals := [s.phases[name] for s in ours if name in s.phases])}
        rows.append([scenario, *(cell(results.get((scenario, m), [])) for m in modes),
                     median_range(hand) if scenario == "start" else "",
                     TARGETS.get(scenario, ""), *(f"{phase[n]:.2f}" if n in phase else "-" for n in PHASES)])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)))


if __name__ == "__main__":
    sys.exit(main())
