"""Where a fleet's start goes: per job, the seconds from its creation to each stage of its start, read off the
objects' own timestamps after the run (no polling while it runs), and the median of each stage over the jobs.
Pure: bench/fleet.py collects the objects (jobs, pods, EndpointSlices) and prints `table`.

The API server and the kubelets stamp whole seconds (creationTimestamp, a condition's lastTransitionTime, a
container's startedAt): each stage is good to a second, which medians over 40 jobs of a 30 s start resolve.
A stage that a side never reaches is absent for it (the bare client writes no EndpointSlice and no condition).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime

from elasticjob.naming import (
    JOB_LABEL,
    RENDEZVOUS_CONTAINER,
    ROLE_LABEL,
    ROLE_RENDEZVOUS,
    ROLE_WORKER,
    WORKER_CONTAINER,
)

# In the order a start passes them. "workers ..." is the last of the job's workers to get there.
STAGES = (
    "store created",  # the store pod's creationTimestamp
    "store scheduled",  # its PodScheduled condition
    "store initialized",  # its Initialized condition: the kit's init container done, where it has one
    "store running",  # the store container's startedAt
    "store ready",  # its Ready condition: the readiness probe reached the store's port
    "endpoint written",  # the operator's EndpointSlice for the Service (written once the store pod runs)
    "first worker created",
    "workers created",
    "workers scheduled",
    "workers initialized",
    "workers running",  # the worker container's startedAt: what the fleet's converge time waits for
    "job Running",  # the operator's Running condition (the phase a person reads)
)


def parse(stamp: str | None) -> datetime | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def condition(obj: dict, kind: str) -> datetime | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return parse(found.get("lastTransitionTime"))
    return None


def started(pod: dict, container: str) -> datetime | None:
    for found in (pod.get("status") or {}).get("containerStatuses") or []:
        if found.get("name") == container:
            state = found.get("state") or {}
            return parse((state.get("running") or state.get("terminated") or {}).get("startedAt"))
    return None


def created(obj: dict) -> datetime | None:
    return parse(obj["metadata"].get("creationTimestamp"))


def latest(times: list[datetime | None], want: int) -> datetime | None:
    """The last of `want` objects to get there; None until every one has."""
    reached = [t for t in times if t is not None]
    return max(reached) if reached and len(reached) >= want else None


def job_stages(job: dict, pods: list[dict], slices: list[dict], workers: int) -> dict[str, float]:
    """Seconds from the job's creation to each stage it reached."""
    labels = lambda o: o["metadata"].get("labels") or {}  # noqa: E731
    store = next((p for p in pods if labels(p).get(ROLE_LABEL) == ROLE_RENDEZVOUS), None)
    crew = [p for p in pods if labels(p).get(ROLE_LABEL) == ROLE_WORKER]
    when: dict[str, datetime | None] = {"job Running": condition(job, "Running")}
    if store is not None:
        when |= {"store created": created(store), "store scheduled": condition(store, "PodScheduled"),
                 "store initialized": condition(store, "Initialized"),
                 "store running": started(store, RENDEZVOUS_CONTAINER), "store ready": condition(store, "Ready")}
    written = [created(s) for s in slices if s.get("endpoints")]
    when["endpoint written"] = min((t for t in written if t is not None), default=None)
    if crew:
        when |= {"first worker created": min(t for t in map(created, crew) if t is not None),
                 "workers created": latest([created(p) for p in crew], workers),
                 "workers scheduled": latest([condition(p, "PodScheduled") for p in crew], workers),
                 "workers initialized": latest([condition(p, "Initialized") for p in crew], workers),
                 "workers running": latest([started(p, WORKER_CONTAINER) for p in crew], workers)}
    origin = created(job)
    if origin is None:
        return {}
    return {stage: (at - origin).total_seconds() for stage, at in when.items() if at is not None}


def ledger(jobs: Iterable[dict], pods: Iterable[dict], slices: Iterable[dict], workers: int) -> dict[str, list[float]]:
    """For each stage, the seconds each job took to reach it (jobs that did not reach it left out)."""
    by_job: dict[str, list[dict]] = {}
    for pod in pods:
        by_job.setdefault((pod["metadata"].get("labels") or {}).get(JOB_LABEL, ""), []).append(pod)
    slices_by_job: dict[str, list[dict]] = {}
    for found in slices:
        slices_by_job.setdefault((found["metadata"].get("labels") or {}).get(JOB_LABEL, ""), []).append(found)
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for job in jobs:
        name = job["metadata"]["name"]
        for stage, seconds in job_stages(job, by_job.get(name, []), slices_by_job.get(name, []), workers).items():
            stages[stage].append(seconds)
    return stages


def medians(runs: list[dict[str, list[float]]]) -> dict[str, float | None]:
    """Per stage, the median over runs of each run's median over its jobs (None: no run reached it)."""
    found: dict[str, float | None] = {}
    for stage in STAGES:
        per_run = [statistics.median(run[stage]) for run in runs if run.get(stage)]
        found[stage] = statistics.median(per_run) if per_run else None
    return found


def table(operator: list[dict[str, list[float]]], bare: list[dict[str, list[float]]]) -> list[str]:
    """Markdown rows: each stage's median seconds after the job's creation, both sides, and the difference."""
    op, bc = medians(operator), medians(bare)
    rows = ["| stage (median s after the job's creation) | operator | bare client | operator - bare |",
            "|---|---|---|---|"]
    cell = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for stage in STAGES:
        a, b = op[stage], bc[stage]
        if a is None and b is None:
            continue
        rows.append(f"| {stage} | {cell(a)} | {cell(b)} | {cell(a - b) if a is not None and b is not None else '-'} |")
    return rows
