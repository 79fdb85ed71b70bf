"""Fixtures of the end-to-end scenarios, and the recovery-time table printed at the end of the session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e_support import Faults, Jobs, LocalProgressReader, PodProgressReader, Progress, parse_events, parse_progress


@dataclass(frozen=True)
class Recovery:
    scenario: str
    fault: str
    seconds: float | None  # fault -> next completed training step; None: training never stepped again
    world_size_after: int | None
    restarts: int | None  # the job's status.restarts at the end


RECOVERIES: list[Recovery] = []
# Kueue scenarios: (scenario, what, seconds), e.g. ("...", "queued -> admitted", 0.8).
ADMISSIONS: list[tuple[str, str, float]] = []
# Where the local cluster keeps its state (faults are injected through it).
LOCAL_STATE = Path(__file__).resolve().parents[2] / ".localcluster"


REAL_NODE_LABEL = "localcluster.dev/node-kind"


@pytest.fixture
def jobs(kube, namespace: str) -> Jobs:
    return Jobs(kube, namespace)


@pytest.fixture
def local_cluster(cluster) -> None:
    """Skips on any cluster but the local one, where the test injects its fault through localcluster. Requested
    before `operator`, so that a skipped test starts no operator."""
    if cluster.kind != "local":
        pytest.skip("the fault is injected through the local cluster (localcluster's faults, its nodes' netns)")


@pytest.fixture
def real_nodes(cluster, jobs) -> None:
    """Skips where the nodes are not real kubelets: the local cluster's process-backed agent enforces no memory
    limit, runs no probe and serves no resource metrics. The local cluster's real nodes and kind's are real."""
    if cluster.kind == "kind":
        return
    nodes = jobs.core.list_node().items
    if not nodes or any((n.metadata.labels or {}).get(REAL_NODE_LABEL) != "real" for n in nodes):
        pytest.skip("needs real nodes (LOCALCLUSTER_NODE_KIND=real, or kind)")


@pytest.fixture
def gpu_nodes(real_nodes, jobs) -> None:
    """Skips where no node advertises nvidia.com/gpu (the local real nodes' device plugin does; kind's do not)."""
    if not any((n.status.allocatable or {}).get("nvidia.com/gpu") for n in jobs.core.list_node().items):
        pytest.skip("no node advertises nvidia.com/gpu (the local cluster's real nodes run a device plugin)")


# The NetworkPolicy enforcers this suite knows, by the name of their pods in kube-system.
ENFORCERS = ("kube-network-policies", "kindnet")


@pytest.fixture
def enforced_policies(cluster, real_nodes, jobs) -> None:
    """Skips where no NetworkPolicy enforcer runs: the local real nodes run kube-network-policies, kindnetd
    enforces policies on kind; kind's node image built here has neither (no module serves kindnetd)."""
    if cluster.kind == "local":
        return
    pods = jobs.core.list_namespaced_pod("kube-system").items
    if not any(p.metadata.name.startswith(ENFORCERS) for p in pods):
        pytest.skip(f"no NetworkPolicy enforcer in kube-system (none of {', '.join(ENFORCERS)})")


class Training:
    """Calling it reads the steps done so far; `events()` the checkpoints saved on SIGTERM."""

    def __init__(self, reader):
        self.reader = reader

    def __call__(self) -> Progress:
        return parse_progress(self.reader.read_text())

    def events(self) -> list[dict]:
        return parse_events(self.reader.read_text("events.jsonl"))


@pytest.fixture
def progress(cluster, jobs: Jobs) -> Iterator[Training]:
    """Calling it reads what training has done so far (examples/train_ddp.py's progress.jsonl)."""
    reader = LocalProgressReader(jobs.namespace) if cluster.kind == "local" else PodProgressReader(jobs)
    yield Training(reader)
    if os.environ.get("E2E_KEEP_PROGRESS") != "1":  # kept for a post-mortem of the run
        reader.close()


@pytest.fixture
def faults(cluster, jobs: Jobs) -> Faults:
    return Faults(cluster, jobs, LOCAL_STATE)


@pytest.fixture
def record_recovery(request: pytest.FixtureRequest) -> Callable[..., None]:
    def record(fault: str, seconds: float | None, world_size_after: int | None, restarts: int | None) -> None:
        RECOVERIES.append(Recovery(request.node.name, fault, seconds, world_size_after, restarts))

    return record


@pytest.fixture
def record_timing(request: pytest.FixtureRequest) -> Callable[[str, float], None]:
    def record(what: str, seconds: float) -> None:
        ADMISSIONS.append((request.node.name, what, seconds))

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if ADMISSIONS:
        terminalreporter.section("measured intervals (admission by Kueue, autoscaling)")
        for scenario, what, seconds in ADMISSIONS:
            terminalreporter.write_line(f"{scenario}  {what:<48} {seconds:6.1f} s")
    if not RECOVERIES:
        return
    terminalreporter.section("elastic recovery: fault -> next completed training step")
    width = max(len(r.scenario) for r in RECOVERIES)
    terminalreporter.write_line(f"{'scenario':<{width}}  {'fault':<34} {'seconds':>8} {'world size':>10} {'restarts':>8}")
    for r in RECOVERIES:
        seconds = f"{r.seconds:.1f}" if r.seconds is not None else "never"
        terminalreporter.write_line(f"{r.scenario:<{width}}  {r.fault:<34} {seconds:>8} {r.world_size_after!s:>10} "
                                    f"{r.restarts!s:>8}")
