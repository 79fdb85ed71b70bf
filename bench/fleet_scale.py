"""Up to 10,000 jobs on one operator, on kwok's fake nodes, against a bare client (issue 37).

For each size, in one run on the same cluster: the bare client (bench/fleet_cluster.py BareClient: per job the
Service, the store pod, 4 workers, one status write, from 32 threads) and then the operator (`--operator-first`:
the other way round), each in a fresh namespace, N jobs of 4 workers created at once from 32 threads. Per size it
prints:

- converge: seconds until every worker is Running, and operator / bare;
- requests per job by the controller at start, counted until every job's status settled: the operator's own count
  of what it sent (elasticjob_api_requests_total, every verb, watches and lists included), and from the API
  server's apiserver_request_total the rows only a controller makes (bench/fleet_cluster.py CONTROLLER_ROWS),
  which also hold what the cluster's own controllers sent meanwhile (the bare client's column shows how much:
  it sends exactly 7 a job);
- the API server's load while the fleet starts: requests per second from every client (the scheduler's
  bindings, kwok's pod status, the controllers, the bench), and the watches open on it at the end
  (apiserver_longrunning_requests, verb WATCH), the operator's run beside the bare client's;
- the operator's resident memory once the fleet runs, its peak (VmHWM) since it started, and its CPU seconds per
  minute while nothing changes (median of 3 windows of 20 s);
- the API server's mean time to create a Service, in each run: it allocates every ClusterIP under one lock, so at
  thousands of jobs Service creates queue there, for any client;
- where this machine's CPU went from the first create until every worker ran, by process (the API server, etcd,
  the scheduler, kwok, the controller manager, the operator, the bench itself), each run beside the other;
- with `--profile S` (on a cluster started with `localcluster up --profiling`): a 30-second CPU profile of the API
  server taken S seconds after each run's first create, saved as .localcluster/apiserver-<jobs>-<side>.pprof for
  `go tool pprof` (what in the API server the operator's requests cost, against the bare client's).

Pods and events are tallied, not kept: a 10,000-job fleet is 50,000 pods. Between runs the operator is stopped,
then every pod is removed at once (grace 0: kwok's pods have no process to stop) and the namespace deleted. With
`--fresh`, each run has a kwok cluster of its own instead, started anew (an empty etcd, new processes): otherwise
the run after a 10,000-job fleet meets a cluster that made and removed one (which of the two runs goes second moved
the ratio by an unknown share), after a clearing of about 25 minutes.

    .venv/bin/localcluster up --nodes 0 --kwok && .venv/bin/python bench/fleet_scale.py 1000 3000 10000
    .venv/bin/python bench/fleet_scale.py --fresh --operator-first 10000
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import METRICS_PORT, WORKER_SELECTOR, idle, operator_metrics  # noqa: E402
from fleet_cluster import (  # noqa: E402
    CONTROLLER_ROWS,
    THREADS,
    WORKERS,
    BareClient,
    Watch,
    apiserver_get,
    create_jobs,
    namespace,
    request_counts,
    running,
)
from harness import GROUP, PLURAL, ROOT, STATE_DIR, VERSION, Api, Operator, wait  # noqa: E402

CONVERGE_LIMIT = 3600.0
DURATION_SUM = "apiserver_request_duration_seconds_sum"
# The API server allocates every Service's ClusterIP under one lock (its allocator), so Service creates queue
# there, for the operator and the bare client alike; the mean shows how long.
SERVICE_CREATE = ("POST", "", "services", "")
OWN_REQUESTS = "elasticjob_api_requests_total"  # the operator's count of every request it sent
# The cluster's processes by their executable's name (kwok's carries its version), then the operator and the bench.
CPU_PROCESSES = ("kube-apiserver", "etcd", "kube-scheduler", "kwok", "kube-controller-manager")


@dataclass
class Tally(Watch):
    """A Watch that keeps, per object, only whether `judge` holds and when it first did."""

    judge: Callable[[dict], bool] = running
    first: dict[str, float] = field(default_factory=dict)
    state: dict[str, bool] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)

    def _replace(self, items: list[dict]) -> None:
        now = time.monotonic()
        with self.lock:
            self.state = {}
            for body in items:
                self._judge(now, body)

    def _seen(self, at: float, kind: str, body: dict) -> None:
        with self.lock:
            self.last = at
            if kind == "DELETED":
                self.state.pop(body["metadata"]["uid"], None)
            else:
                self._judge(at, body)

    def _judge(self, at: float, body: dict) -> None:
        uid, holds = body["metadata"]["uid"], self.judge(body)
        self.state[uid] = holds
        if holds:
            self.first.setdefault(uid, at)

    def count(self) -> int:
        with self.lock:
            return sum(self.state.values())


def settled(job: dict) -> bool:
    status = job.get("status") or {}
    return status.get("phase") == "Running" and status.get("readyReplicas") == WORKERS


def open_watches(text: str) -> float:
    """The watches open on the API server, from its /metrics `text`."""
    return sum(float(v) for labels, v in re.findall(r"^apiserver_longrunning_requests\{([^}]*)\} (\S+)$", text, re.M)
               if 'verb="WATCH"' in labels)


def peak_mib(pid: int) -> float:
    found = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(found.group(1)) / 1024 if found else float("nan")


@dataclass
class Run:
    seconds: float
    requests_per_job: float
    api_per_second: float
    watches: float
    rss_mib: float = 0.0
    peak_mib: float = 0.0
    cpu_per_minute: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    service_create_s: float = 0.0  # the API server's mean time to create a Service (its ClusterIP allocation)
    own_requests_per_job: float = float("nan")  # the operator's count of what it sent (no operator: nan)


def cpu_seconds(operator: psutil.Process | None) -> dict[str, float]:
    """CPU seconds (user and system) used so far by each of the cluster's processes, the operator and the bench."""
    used: dict[str, float] = dict.fromkeys((*CPU_PROCESSES, "operator", "bench"), 0.0)
    watched = {operator.pid: "operator"} if operator is not None else {}
    watched[psutil.Process().pid] = "bench"
    for proc in psutil.process_iter(["name"]):
        name = watched.get(proc.pid) or next((n for n in CPU_PROCESSES if (proc.info["name"] or "").startswith(n)),
                                             None)
        if name is None:
            continue
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # gone meanwhile
        used[name] += times.user + times.system
    return used


def sent_requests(operator: psutil.Process | None) -> float:
    """Every request the operator has sent so far, by its own count (nan without an operator)."""
    return operator_metrics().get(OWN_REQUESTS, float("nan")) if operator is not None else float("nan")


def progress(pods: Tally, want: int, started: float, every: float = 60.0) -> Callable[[], bool]:
    """Whether every worker runs; once a minute it says how many do, on stderr (a large fleet takes an hour)."""
    last = [started]  # when it last said so

    def done() -> bool:
        count, now = pods.count(), time.monotonic()
        if count < want and now - last[0] >= every:
            last[0] = now
            print(f"    {count:,} of {want:,} workers Running at {(now - started) / 60:.1f} min", file=sys.stderr,
                  flush=True)
        return count == want
    return done


def profile_later(after: float, path: Path, seconds: int = 30) -> threading.Thread:
    """The API server's CPU profile for `seconds`, taken `after` seconds from now, saved to `path` (or why not,
    on stderr): the run goes on meanwhile."""
    def take() -> None:
        time.sleep(after)  # a point in the run to sample, not a wait for anything
        try:
            path.write_bytes(apiserver_get(f"/debug/pprof/profile?seconds={seconds}", timeout=seconds + 60))
            print(f"    the API server's CPU profile: {path}", file=sys.stderr, flush=True)
        except OSError as exc:  # 404 when the API server runs without --profiling
            print(f"    no CPU profile of the API server ({exc}): start the cluster with `localcluster up "
                  f"--profiling`", file=sys.stderr, flush=True)
    thread = threading.Thread(target=take, name="profile", daemon=True)
    thread.start()
    return thread


def start_fleet(api: Api, ns: str, jobs: int, bare: bool, proc: psutil.Process | None,
                profile_after: float | None = None) -> Run:
    pods = Tally(lambda **kw: api.core.list_namespaced_pod(ns, **kw), WORKER_SELECTOR).start()
    listed = Tally(lambda **kw: api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw),
                   judge=settled).start()
    wait(lambda: pods.listed.is_set() and listed.listed.is_set(), 60, "the bench's watches")
    metrics = apiserver_get("/metrics").decode()  # one read for both counters, at each end
    before, took_before = request_counts(text=metrics), request_counts(DURATION_SUM, metrics)
    t0, cpu_before = time.monotonic(), cpu_seconds(proc)
    sent_before = sent_requests(proc)
    client = BareClient(api) if bare else None
    profiling = None if profile_after is None else profile_later(
        profile_after, STATE_DIR / f"apiserver-{jobs}-{'bare' if bare else 'operator'}.pprof")
    started = create_jobs(api, ns, jobs, True, client.submit if client else None)
    if client:
        client.close()
    want = jobs * WORKERS
    wait(progress(pods, want, started), CONVERGE_LIMIT, f"{want} workers Running", interval=1)
    seconds = max(pods.first.values()) - started
    cpu = {k: v - cpu_before[k] for k, v in cpu_seconds(proc).items()}
    if not bare:  # the operator's status writes settle after the pods: count them too
        wait(lambda: listed.count() == jobs, 1800, f"{jobs} jobs Running with {WORKERS} ready", interval=1)
    wait(lambda: time.monotonic() - max(listed.last, pods.last) >= 5, 300, "no change for 5 s", interval=0.5)
    metrics, t1 = apiserver_get("/metrics").decode(), time.monotonic()
    counts, took = request_counts(text=metrics) - before, request_counts(DURATION_SUM, metrics) - took_before
    run = Run(seconds, sum(v for k, v in counts.items() if k in CONTROLLER_ROWS) / jobs,
              sum(counts.values()) / (t1 - t0), open_watches(metrics), cpu=cpu,
              service_create_s=took[SERVICE_CREATE] / max(counts[SERVICE_CREATE], 1),
              own_requests_per_job=(sent_requests(proc) - sent_before) / jobs)
    if proc is not None:
        steady = idle(proc)
        run.rss_mib, run.peak_mib, run.cpu_per_minute = steady.rss_mib, peak_mib(proc.pid), steady.cpu_per_minute
    pods.stop()
    listed.stop()
    if profiling is not None:
        profiling.join()
    return run


def clear(api: Api, ns: str) -> None:
    """Every pod at once, then the jobs; the namespace's deletion does the rest. Each deletecollection is asked
    again until nothing of its kind is left: one call may outlast the API server's request timeout (a 504 at
    10,000 jobs) having deleted some."""
    pods = (lambda: api.core.list_namespaced_pod(ns, limit=1).items,
            lambda: api.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _request_timeout=300,
                                                              _preload_content=False).data)
    jobs = (lambda: api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, limit=1)["items"],
            lambda: api.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                          _request_timeout=300,
                                                                          _preload_content=False).data)
    for what, (left, delete) in (("pods", pods), ("jobs", jobs)):
        deadline = time.monotonic() + 900
        while left() and time.monotonic() < deadline:
            try:
                delete()
            except Exception as exc:  # a timed-out call has deleted some: go on
                print(f"  deleting {what}: {exc.__class__.__name__}; again", file=sys.stderr, flush=True)


def said(side: str, jobs: int, run: Run) -> None:
    """One run's figures on stderr as soon as they are measured, before the cluster is cleared: a run of an hour
    is not lost to what comes after it."""
    cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in run.cpu.items())
    print(f"  {jobs} jobs, {side}: converge {run.seconds:.1f} s, requests/job {run.own_requests_per_job:.2f} "
          f"sent (by the API server's controller rows {run.requests_per_job:.2f}), "
          f"API requests/s {run.api_per_second:.0f}, watches {run.watches:.0f}, Service create "
          f"{run.service_create_s:.2f} s, RSS {run.rss_mib:.0f} MiB (peak {run.peak_mib:.0f}), idle CPU "
          f"{run.cpu_per_minute:.2f} s/min; CPU s: {cpu}", file=sys.stderr, flush=True)


def measure(jobs: int, operator_args: list[str], operator_first: bool, profile_after: float | None,
            fresh: bool) -> tuple[Run, Run]:
    """Both sides at `jobs`; with `fresh`, each on a cluster of its own, started anew, so that neither meets what
    the other left (a cluster that made and removed 10,000 jobs)."""
    def cluster() -> Api:
        return cluster_api(fresh, profile_after is not None)

    def bare_run() -> Run:
        api = cluster()
        with namespace(api, "scale-bare", keep=fresh) as ns:
            bare = start_fleet(api, ns, jobs, True, None, profile_after)
            said("bare client", jobs, bare)
            if not fresh:
                clear(api, ns)
        return bare

    def operator_run() -> Run:
        api = cluster()
        with namespace(api, "scale-op", keep=fresh) as ns:
            with Operator(STATE_DIR / f"fleet-scale-{jobs}.log",
                          [*operator_args, "--metrics-port", str(METRICS_PORT)]) as op:
                operator = start_fleet(api, ns, jobs, False, psutil.Process(op.proc.pid), profile_after)
            said("operator", jobs, operator)
            if not fresh:
                clear(api, ns)
        return operator

    if operator_first:
        operator = operator_run()
        return operator, bare_run()
    bare = bare_run()
    return operator_run(), bare


def cluster_api(fresh: bool, profiling: bool) -> Api:
    """The bench's client, its CRD installed; with `fresh`, on a kwok cluster started anew (`localcluster down`,
    then `up`: an empty etcd, every component a new process), else the one cluster every run shares."""
    if not fresh:
        return shared_api()
    for argv in (["down"], ["up", "--nodes", "0", "--kwok", *(["--profiling"] if profiling else [])]):
        print(f"  localcluster {' '.join(argv)}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "localcluster", *argv], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return connected_api()


@functools.cache
def shared_api() -> Api:
    return connected_api()


def connected_api() -> Api:
    api = Api()
    api.connections(2 * THREADS + 8)  # the job creators, the bare client's threads, the watches
    api.install_crd()
    return api


def table(results: dict[int, tuple[Run, Run]]) -> None:
    header = ("jobs (x4 workers)", "converge s: operator", "bare client", "operator / bare (target <= 1.3x)",
              "requests per job at start, the operator's own count (target <= 10)",
              "controller rows of the API server per job: operator run", "bare run (sends 7)",
              "API server requests/s while starting: operator run", "bare run", "watches open: operator run",
              "bare run", "operator RSS MiB, fleet running (target <= 600)", "peak", "operator CPU s/min, idle",
              "Service create s, mean: operator run", "bare run")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for jobs, (op, bare) in sorted(results.items()):
        cells = (f"{jobs:,}", f"{op.seconds:.1f}", f"{bare.seconds:.1f}", f"{op.seconds / bare.seconds:.2f}x",
                 f"{op.own_requests_per_job:.2f}", f"{op.requests_per_job:.2f}", f"{bare.requests_per_job:.2f}",
                 f"{op.api_per_second:.0f}",
                 f"{bare.api_per_second:.0f}", f"{op.watches:.0f}", f"{bare.watches:.0f}", f"{op.rss_mib:.0f}",
                 f"{op.peak_mib:.0f}", f"{op.cpu_per_minute:.2f}", f"{op.service_create_s:.2f}",
                 f"{bare.service_create_s:.2f}")
        print("| " + " | ".join(cells) + " |")
    print()
    names = (*CPU_PROCESSES, "operator", "bench")
    print("| CPU s from the first create until every worker ran | " + " | ".join(names) + " | all |")
    print("|" + "---|" * (len(names) + 2))
    for jobs, runs in sorted(results.items()):
        for side, run in zip(("operator", "bare client"), runs, strict=True):
            row = [f"{run.cpu.get(n, 0.0):.1f}" for n in names] + [f"{sum(run.cpu.values()):.1f}"]
            print(f"| {jobs:,} jobs, {side} run | " + " | ".join(row) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", type=int, nargs="*", default=[1000, 3000, 10000], help="jobs per fleet")
    parser.add_argument("--operator-args", default="", help="extra arguments for `elasticjob run`")
    parser.add_argument("--operator-first", action="store_true",
                        help="the operator's run before the bare client's (without --fresh, the second run meets a "
                             "cluster that has made and removed a whole fleet)")
    parser.add_argument("--profile", type=float, default=None, metavar="S",
                        help="a 30 s CPU profile of the API server S seconds into each run (needs `localcluster up "
                             "--profiling`; a run that ends sooner waits for it)")
    parser.add_argument("--fresh", action="store_true",
                        help="each run on a kwok cluster of its own, started anew (`localcluster down`, then `up "
                             "--nodes 0 --kwok`, with --profiling for --profile): no run meets what the one before "
                             "it left, and nothing is cleared; the last run's fleet is left on the cluster")
    args = parser.parse_args()
    results = {}
    for jobs in args.sizes:
        results[jobs] = measure(jobs, args.operator_args.split(), args.operator_first, args.profile, args.fresh)
        table(results)  # so far, in case a larger size does not finish
    return 0


if __name__ == "__main__":
    sys.exit(main())
