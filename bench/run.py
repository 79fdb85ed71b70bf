"""Benchmarks of the operator's per-event work, printed as a table.

The reconcile of one job is observe + plan over that job's pods only (the index hands them over; no LIST).
This measures that work as the job grows, and the ratio to the smallest size in the same run: per-pod
cost should stay flat (linear work), which is what lets one operator serve many large jobs.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from elasticjob import builders, planner  # noqa: E402
from elasticjob.domain import JobRef  # noqa: E402
from elasticjob.models import ElasticJobSpec, ElasticJobStatus  # noqa: E402
from elasticjob.observe import ServiceView, pod_view  # noqa: E402

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SIZES = (8, 64, 256, 1024)
REPEATS = 7


def job(nodes: int) -> planner.Job:
    spec = ElasticJobSpec.model_validate({
        "minReplicas": 1, "maxReplicas": nodes, "replicas": nodes,
        "template": {"spec": {"containers": [{"name": "worker", "image": "t", "command": ["torchrun", "t.py"]}]}}})
    status = ElasticJobStatus.model_validate({"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                                              "rendezvous": {"ready": True}})
    return planner.Job(JobRef("ns", "big", "uid", spec), 1, status)


def pod_bodies(j: planner.Job, nodes: int) -> list[dict]:
    bodies = []
    for i in range(nodes):
        body = builders.worker_pod(j.ref, i, "10.96.0.1:29400", 3)
        body["metadata"]["uid"] = f"uid-{i}"
        body["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                          "containerStatuses": [{"name": "worker", "state": {"running": {}}}]}
        bodies.append(body)
    rdzv = builders.rendezvous_pod(j.ref)
    rdzv["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return bodies + [rdzv]


def best_of(fn) -> float:
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples), statistics.median(samples)


def main() -> None:
    rows = []
    for nodes in SIZES:
        j = job(nodes)
        bodies = pod_bodies(j, nodes)
        views = [pod_view(b) for b in bodies]
        service = ServiceView("big-rdzv", "10.96.0.1")
        observe_best, _ = best_of(lambda: [pod_view(b) for b in bodies])
        plan_best, plan_median = best_of(lambda: planner.plan(j, planner.Observed(views, service), NOW))
        result = planner.plan(j, planner.Observed(views, service), NOW)
        assert not result.actions, "a steady job must plan no actions"
        rows.append((nodes, observe_best, plan_best, plan_median))
    base = (rows[0][1] + rows[0][2]) / rows[0][0]
    print(f"{'pods':>6} | {'observe ms':>10} | {'plan ms':>8} | {'plan median ms':>14} | {'us per pod':>10} | "
          f"{'per-pod vs 8':>12}")
    print("-" * 76)
    for nodes, observe, plan_best, plan_median in rows:
        per_pod = (observe + plan_best) / nodes
        print(f"{nodes:>6} | {observe * 1e3:>10.2f} | {plan_best * 1e3:>8.2f} | {plan_median * 1e3:>14.2f} | "
              f"{per_pod * 1e6:>10.1f} | {per_pod / base:>11.2f}x")


if __name__ == "__main__":
    main()
