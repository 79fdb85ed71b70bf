"""A fleet of jobs on one operator, measured against the real API server and against a bare client.

One table, measured in one run (2 cores; the local cluster with 3 real nodes and kwok's fake nodes):

- **converge**: N jobs of 4 workers (sleep containers) created at once (32 threads), the time until every worker
  is Running; beside it a bare client with the same client library and the same concurrency (32 threads create
  the jobs, 32 more make each job's objects as its create returns) creating what the operator must: per job the
  Service, the store pod, 4 worker pods (the operator's own manifests, from elasticjob.builders) and one status
  write. The bare client makes no NetworkPolicy (the operator makes one per namespace unless
  --no-network-policy) and posts no Events. On real nodes the stores are the light stand-in
  (`spec.rendezvous.image: elasticjob-store-standin`, localcluster/storestandin.py); on kwok nothing runs.
- **API requests per job** at start (create to every worker Running and every job's status settled), by verb
  and resource, from the API server's own `apiserver_request_total` (its /metrics, admin kubeconfig), before and
  after. Those counters have no client label: rows that only the operator (or the bare client) makes are marked;
  the others (the scheduler's bindings, the node agents' and kwok's pod status, ...) run in both.
- **operator cost** on kwok nodes at --fleet sizes: resident memory (RSS) and CPU seconds per minute while nothing
  changes (median of 3 windows of 20 s), with every job running, then with every job finished (the bench marks
  each worker Succeeded, as a kubelet would when training ends); reconciles per minute from its own metrics.
- **event -> action latency** under churn on kwok at --churn jobs: scale-downs, scale-ups and pod deletions
  spread over many jobs, from the bench's write to the operator's resulting pod deletion or creation (seen by
  the bench's pod watch), p50 and p99.

    make bench-fleet      # or: .venv/bin/localcluster up --nodes 3 --kwok && .venv/bin/python bench/fleet.py
    .venv/bin/python bench/fleet.py --real-jobs 50 --runs 3 --fleet 100 300 1000 --churn 300
    .venv/bin/python bench/fleet.py --processes 40 --process-kit Copy Image --real-jobs 0 --fleet  # processes
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_processes  # noqa: E402
from fleet_cluster import (  # noqa: E402
    BENCH_ROWS,
    CONTROLLER_ROWS,
    THREADS,
    WORKERS,
    BareClient,
    Watch,
    create_jobs,
    finish_all,
    namespace,
    request_counts,
    running,
)
from harness import GROUP, PLURAL, STATE_DIR, VERSION, Api, Operator, wait  # noqa: E402

METRICS_PORT = 9319
WORKER_SELECTOR = "elasticjob.dev/role=worker"


# ------------------------------------------------------------------------------------------------ measurements


@dataclass
class Start:
    """One converge run: seconds until every worker Running, and the API requests it took."""

    seconds: float
    requests: Counter


def converge(api: Api, ns: str, jobs: int, kwok: bool, bare: bool) -> Start:
    pods = Watch(lambda **kw: api.core.list_namespaced_pod(ns, **kw), WORKER_SELECTOR).start()
    listed = Watch(lambda **kw: api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw)).start()
    time.sleep(1)
    before = request_counts()
    worker = BareClient(api) if bare else None
    started = create_jobs(api, ns, jobs, kwok, worker.submit if worker else None)
    if worker:
        worker.close()
    want = jobs * WORKERS
    wait(lambda: sum(map(running, pods.snapshot())) == want, 1800, f"{want} workers Running", interval=0.2)
    first_running: dict[str, float] = {}
    for at, _, body in pods.since(started):
        if running(body):
            first_running.setdefault(body["metadata"]["uid"], at)
    seconds = max(first_running.values()) - started
    if not bare:  # the operator's status writes settle after the pods: count them too
        wait(lambda: _settled(listed.snapshot(), jobs), 600, "every job Running with 4 ready", interval=0.5)
    _quiet(listed)
    requests = request_counts() - before
    pods.stop()
    listed.stop()
    return Start(seconds, requests)


def _settled(jobs: list[dict], count: int) -> bool:
    return len(jobs) == count and all((j.get("status") or {}).get("phase") == "Running"
                                      and (j.get("status") or {}).get("readyReplicas") == WORKERS for j in jobs)


def _quiet(watch: Watch, seconds: float = 5.0, limit: float = 120.0) -> None:
    """Until no job changed for `seconds` (the operator's last status writes are in)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        last = max((e[0] for e in watch.since(0)), default=0.0)
        if time.monotonic() - last >= seconds:
            return
        time.sleep(0.5)


def operator_metrics() -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()
    found: dict[str, float] = {}
    for name, _labels, value in re.findall(r"^(elasticjob_\w+?)(\{[^}]*\})? (\S+)$", text, re.M):
        found[name] = found.get(name, 0.0) + float(value)
    found["job series"] = len(re.findall(r"^elasticjob_job_(?:phase|restarts)\{", text, re.M))
    return found


@dataclass
class Idle:
    rss_mib: float
    cpu_per_minute: float
    reconciles_per_minute: float


def idle(proc: psutil.Process, windows: int = 3, seconds: float = 20.0) -> Idle:
    """While nothing changes: RSS at the end, and the median CPU seconds per minute of `windows` windows."""
    cpu, reconciles = [], []
    for _ in range(windows):
        t0, r0 = sum(proc.cpu_times()[:2]), operator_metrics().get("elasticjob_reconciles_total", 0.0)
        time.sleep(seconds)
        t1, r1 = sum(proc.cpu_times()[:2]), operator_metrics().get("elasticjob_reconciles_total", 0.0)
        cpu.append((t1 - t0) * 60 / seconds)
        reconciles.append((r1 - r0) * 60 / seconds)
    return Idle(proc.memory_info().rss / 2**20, statistics.median(cpu), statistics.median(reconciles))


@dataclass
class Churn:
    kind: str
    seconds: list[float]


def churn(api: Api, ns: str, jobs: int, pods: Watch, operations: int, rate: float) -> list[Churn]:
    """Scale-downs (4 -> 3: the operator deletes worker-3), scale-ups of those jobs (3 -> 4: it creates
    worker-3 again) and deletions of worker-1 of other jobs (it creates a replacement), each on a job of its
    own, `rate` per second, in random order. Latency: the bench's write to the pod event showing the action."""
    names = [f"j{i:04d}" for i in range(jobs)]
    random.Random(11).shuffle(names)
    downs = names[:operations // 3]
    deletes = names[operations // 3: operations - operations // 3]
    plan = [("scale down", n) for n in downs] + [("delete pod", n) for n in deletes]
    random.Random(12).shuffle(plan)
    ups = [("scale up", n) for n in downs]
    done: list[tuple[str, str, float, str]] = []  # kind, pod, write time, uid before
    for kind, name in plan + ups:
        if kind == "scale up":
            wait(lambda: f"{name}-worker-3" not in pods.objects, 60, f"{name}-worker-3 gone")
        uid = (pods.objects.get(f"{name}-worker-1") or {}).get("metadata", {}).get("uid", "")
        at = time.monotonic()
        if kind == "delete pod":
            api.core.delete_namespaced_pod(f"{name}-worker-1", ns, _preload_content=False)
            done.append((kind, f"{name}-worker-1", at, uid))
        else:
            api.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, name, {"spec": {
                "replicas": WORKERS - 1 if kind == "scale down" else WORKERS}}, _preload_content=False)
            done.append((kind, f"{name}-worker-3", at, ""))
        time.sleep(max(0.0, at + 1 / rate - time.monotonic()))
    time.sleep(5)
    results: dict[str, list[float]] = {"scale down": [], "scale up": [], "delete pod": []}
    for kind, pod, at, uid in done:
        for seen, event, body in pods.since(at):
            meta = body["metadata"]
            if meta["name"] != pod:
                continue
            if kind == "scale down" and (event == "DELETED" or meta.get("deletionTimestamp")):
                results[kind].append(seen - at)
                break
            if kind != "scale down" and event == "ADDED" and meta["uid"] != uid:
                results[kind].append(seen - at)
                break
    return [Churn(kind, values) for kind, values in results.items()]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


# ------------------------------------------------------------------------------------------------ the table


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, ...]] = []

    def add(self, *cells: Any) -> None:
        self.rows.append(tuple(str(c) for c in cells))
        print("  " + " | ".join(self.rows[-1]), file=sys.stderr, flush=True)  # progress as it is measured

    def print(self) -> None:
        header = ("what", "jobs", "nodes", "operator", "bare client", "operator / bare")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in self.rows:
            print("| " + " | ".join(row + ("",) * (len(header) - len(row))) + " |")


def med(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    text = f"{statistics.median(values):.{digits}f}"
    return text if len(values) == 1 else f"{text} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def requests_rows(table: Table, jobs: int, nodes: str, operator: list[Counter], bare: list[Counter]) -> None:
    def per_job(runs: list[Counter], key: tuple) -> float:
        return statistics.median([r.get(key, 0.0) for r in runs]) / jobs

    keys = sorted(set().union(*operator, *bare), key=lambda k: (k not in CONTROLLER_ROWS, k))
    total_op = total_bare = 0.0
    for key in keys:
        op, bc = per_job(operator, key), per_job(bare, key)
        if key in CONTROLLER_ROWS:
            total_op, total_bare = total_op + op, total_bare + bc
        if max(op, bc) < 0.05 or key in BENCH_ROWS:
            continue
        verb, group, resource, sub = key
        what = f"{verb} {group + '/' if group else ''}{resource}{'/' + sub if sub else ''}"
        mark = "" if key in CONTROLLER_ROWS else " (cluster)"
        table.add(f"  requests per job: {what}{mark}", jobs, nodes, f"{op:.2f}", f"{bc:.2f}", "")
    table.add("requests per job by the controller (target: workers + 4 = 8)", jobs, nodes, f"{total_op:.1f}",
              f"{total_bare:.1f}", f"{total_op / total_bare:.2f}x" if total_bare else "")


def measure_converge(api: Api, table: Table, jobs: int, kwok: bool, runs: int, operator_args: list[str],
                     label: str) -> None:
    nodes = "kwok" if kwok else "real, stand-in stores"
    results: dict[bool, list[Start]] = {False: [], True: []}
    for run in range(runs):
        for bare in (True, False):  # alternating, so that drift hits both alike
            with namespace(api, "fleet-bare" if bare else "fleet-op") as ns:
                if bare:
                    results[bare].append(converge(api, ns, jobs, kwok, bare))
                else:
                    with Operator(STATE_DIR / "fleet-operator.log", operator_args):
                        results[bare].append(converge(api, ns, jobs, kwok, bare))
            print(f"  run {run + 1}: {'bare' if bare else 'operator'} {results[bare][-1].seconds:.1f}s",
                  file=sys.stderr, flush=True)
    op, bare_s = [r.seconds for r in results[False]], [r.seconds for r in results[True]]
    ratios = [o / b for o, b in zip(op, bare_s)]
    table.add(f"converge: every worker Running, s{label} (target: <= 1.3x)", jobs, nodes, med(op), med(bare_s),
              f"{med(ratios, 2)}x")
    requests_rows(table, jobs, nodes, [r.requests for r in results[False]], [r.requests for r in results[True]])


def measure_fleet(api: Api, table: Table, jobs: int, churn_at: int, operator_args: list[str]) -> None:
    """On kwok: converge, requests, steady and finished cost; churn latency at `churn_at` jobs."""
    with namespace(api, "fleet") as ns, Operator(STATE_DIR / "fleet-operator.log",
                                                 [*operator_args, "--metrics-port", str(METRICS_PORT)]) as op:
        proc = psutil.Process(op.proc.pid)
        start = converge(api, ns, jobs, kwok=True, bare=False)
        table.add("converge: every worker Running, s", jobs, "kwok", f"{start.seconds:.1f}", "", "")
        pods = Watch(lambda **kw: api.core.list_namespaced_pod(ns, **kw), WORKER_SELECTOR).start()
        time.sleep(10)  # the first store reads fail and back off
        steady = idle(proc)
        table.add("operator RSS, MiB, jobs running", jobs, "kwok", f"{steady.rss_mib:.0f}", "",
                  "(target <= 150 MB = 143 MiB at 1000)")
        table.add("operator CPU s/min, jobs running (nothing changes)", jobs, "kwok", f"{steady.cpu_per_minute:.2f}",
                  "", "")
        table.add("reconciles/min, jobs running", jobs, "kwok", f"{steady.reconciles_per_minute:.1f}", "", "")
        if jobs == churn_at:
            for result in churn(api, ns, jobs, pods, operations=min(jobs, 300), rate=10):
                table.add(f"event -> action s, {result.kind}, p50 / p99 (n={len(result.seconds)}; target p99 <= 1)",
                          jobs, "kwok",
                          f"{percentile(result.seconds, 0.5):.2f} / {percentile(result.seconds, 0.99):.2f}", "", "")
            wait(lambda: sum(map(running, pods.snapshot())) == jobs * WORKERS, 300, "churn settled")
            time.sleep(5)
        finish_all(api, ns, pods)
        listed = Watch(lambda **kw: api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw)).start()
        wait(lambda: len(listed.snapshot()) == jobs and all((j.get("status") or {}).get("phase") == "Succeeded"
                                                            for j in listed.snapshot()), 900, "every job Succeeded",
             interval=1)
        _quiet(listed)
        done = idle(proc)
        table.add("operator RSS, MiB, jobs finished", jobs, "kwok", f"{done.rss_mib:.0f}", "", "")
        table.add("operator CPU s/min, jobs finished", jobs, "kwok", f"{done.cpu_per_minute:.2f}", "", "")
        table.add("reconciles/min, jobs finished (target: a slow resync)", jobs, "kwok",
                  f"{done.reconciles_per_minute:.1f}", "", "")
        table.add("per-job metric series, jobs finished", jobs, "kwok", f"{operator_metrics()['job series']:.0f}",
                  "", "")
        pods.stop()
        listed.stop()


def measure_processes(api: Api, table: Table, jobs: int, runs: int, workers: str, kit: str,
                      operator_args: list[str]) -> Callable[[], None]:
    """The converge row with real processes; returns what prints where their starts went (after the table)."""
    operator, bare = fleet_processes.measure(api, jobs, runs, workers, kit, operator_args)
    op, bc, ratios = fleet_processes.ratio_cells(operator, bare)
    label = f"{workers} workers, real stores, kit: {kit}"
    table.add(f"converge with processes ({label}): every worker Running, s (target: <= 1.15x)", jobs, "real",
              med(op), med(bc), f"{med(ratios, 2)}x")
    return lambda: fleet_processes.print_ledger(operator, bare, label)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-jobs", type=int, default=50, help="jobs on the real nodes (0: skip)")
    parser.add_argument("--runs", type=int, default=3, help="converge runs on real nodes, each way")
    parser.add_argument("--kwok-converge", type=int, default=300, help="jobs for converge vs bare on kwok (0: skip)")
    parser.add_argument("--fleet", type=int, nargs="*", default=[100, 300, 1000], help="kwok fleet sizes")
    parser.add_argument("--churn", type=int, default=300, help="the fleet size that gets churned")
    parser.add_argument("--operator-args", default="", help="extra arguments for `elasticjob run`")
    parser.add_argument("--processes", type=int, default=0, metavar="JOBS",
                        help="jobs whose pods run real processes on the real nodes, the real store included "
                             "(bench/fleet_processes.py; 0: skip)")
    parser.add_argument("--process-workers", choices=sorted(fleet_processes.WORKER_COMMANDS), default="sleep",
                        help="what each worker runs with --processes")
    parser.add_argument("--process-kit", choices=("Copy", "Image"), nargs="+", default=["Copy"],
                        help="spec.kit of the --processes jobs; each one named is measured in turn")
    args = parser.parse_args()
    api = Api()
    api.connections(2 * THREADS + 8)  # the job creators, the bare client's threads, the watches
    api.install_crd()
    extra = args.operator_args.split()
    table = Table()
    ledgers = []
    for kit in args.process_kit if args.processes else ():
        ledgers.append(measure_processes(api, table, args.processes, args.runs, args.process_workers, kit, extra))
    if args.real_jobs:
        measure_converge(api, table, args.real_jobs, kwok=False, runs=args.runs, operator_args=extra, label="")
    if args.kwok_converge:
        measure_converge(api, table, args.kwok_converge, kwok=True, runs=1, operator_args=extra, label="")
    for jobs in args.fleet:
        measure_fleet(api, table, jobs, args.churn, extra)
    table.print()
    for print_ledger in ledgers:
        print_ledger()
    return 0


if __name__ == "__main__":
    sys.exit(main())
