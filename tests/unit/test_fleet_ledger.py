"""The fleet's start ledger (bench/fleet_ledger.py): each stage read off the right timestamp, the last worker
counted only once every worker got there, medians per stage, both sides side by side."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from elasticjob import builders  # noqa: E402
from elasticjob.domain import JobRef  # noqa: E402
from elasticjob.models import ElasticJobSpec  # noqa: E402
from fleet_ledger import STAGES, job_stages, ledger, medians, table  # noqa: E402

WORKERS = 4
SPEC = ElasticJobSpec.model_validate({"minReplicas": 1, "maxReplicas": WORKERS, "replicas": WORKERS, "template": {
    "spec": {"containers": [{"name": "worker", "image": "w", "command": ["sleep", "3600"]}]}}})


def at(second: int) -> str:
    return f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z"


def job(name: str, running: int | None = None) -> dict:
    conditions = [] if running is None else [{"type": "Running", "status": "True", "lastTransitionTime": at(running)}]
    return {"metadata": {"name": name, "creationTimestamp": at(0)}, "status": {"conditions": conditions}}


def pod(manifest: dict, made: int, scheduled: int, initialized: int, started: int | None, ready: int | None) -> dict:
    container = manifest["spec"]["containers"][0]["name"]
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)},
                  {"type": "Initialized", "status": "True", "lastTransitionTime": at(initialized)},
                  {"type": "Ready", "status": "True" if ready is not None else "False",
                   "lastTransitionTime": at(ready if ready is not None else made)}]
    state = {"running": {"startedAt": at(started)}} if started is not None else {"waiting": {"reason": "Init"}}
    return {**manifest, "metadata": {**manifest["metadata"], "creationTimestamp": at(made)},
            "status": {"conditions": conditions, "containerStatuses": [{"name": container, "state": state}]}}


def pods(name: str, last_started: int | None = 9) -> list[dict]:
    ref = JobRef(namespace="ns", name=name, uid="u", spec=SPEC)
    store = pod(builders.rendezvous_pod(ref), 1, 2, 3, 4, 5)
    crew = [pod(builders.worker_pod(ref, i, "10.0.0.1:29400"), 2 + (i == 3), 3, 5, 7, 7) for i in range(WORKERS - 1)]
    crew.append(pod(builders.worker_pod(ref, WORKERS - 1, "10.0.0.1:29400"), 3, 4, 6, last_started, last_started))
    return [store, *crew]


def endpoint_slice(name: str, written: int) -> dict:
    ref = JobRef(namespace="ns", name=name, uid="u", spec=SPEC)
    made = builders.rendezvous_endpoints(ref, ("store", "uid", "10.1.0.2"))
    return {**made, "metadata": {**made["metadata"], "creationTimestamp": at(written)}}


@pytest.mark.parametrize("stage, seconds", [
    ("store created", 1), ("store scheduled", 2), ("store initialized", 3), ("store running", 4), ("store ready", 5),
    ("endpoint written", 6), ("first worker created", 2), ("workers created", 3), ("workers scheduled", 4),
    ("workers initialized", 6), ("workers running", 9), ("job Running", 10),
])
def test_each_stage_is_read_off_its_own_timestamp(stage, seconds):
    assert job_stages(job("a", running=10), pods("a"), [endpoint_slice("a", 6)], WORKERS)[stage] == seconds


def test_workers_running_waits_for_the_last_worker():
    found = job_stages(job("a"), pods("a", last_started=None), [], WORKERS)
    assert "workers running" not in found and "workers created" in found


def test_a_side_that_writes_no_endpoint_or_condition_has_no_such_stage():
    found = job_stages(job("a"), pods("a"), [], WORKERS)
    assert "endpoint written" not in found and "job Running" not in found


def test_an_empty_endpoint_slice_is_not_an_endpoint_written():
    ref = JobRef(namespace="ns", name="a", uid="u", spec=SPEC)
    empty = builders.rendezvous_endpoints(ref, None)
    empty["metadata"]["creationTimestamp"] = at(1)
    assert "endpoint written" not in job_stages(job("a"), pods("a"), [empty], WORKERS)


def test_the_ledger_matches_pods_to_their_jobs_and_medians_per_stage():
    runs = [ledger([job("a"), job("b")], pods("a", 9) + pods("b", 11), [], WORKERS),
            ledger([job("a")], pods("a", 20), [], WORKERS)]
    assert runs[0]["workers running"] == [9, 11]
    assert medians(runs)["workers running"] == 15  # the median of the runs' medians 10 and 20
    assert medians(runs)["endpoint written"] is None


def test_the_table_puts_both_sides_side_by_side_in_stage_order():
    operator = [ledger([job("a", running=12)], pods("a", 9), [endpoint_slice("a", 6)], WORKERS)]
    bare = [ledger([job("a")], pods("a", 7), [], WORKERS)]
    rows = table(operator, bare)
    assert "| workers running | 9.0 | 7.0 | 2.0 |" in rows
    assert "| endpoint written | 6.0 | - | - |" in rows
    stages = [row.split(" | ")[0].strip("| ") for row in rows[2:]]
    assert stages == [s for s in STAGES if s in stages]
