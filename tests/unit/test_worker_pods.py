"""The workers sorted once (observe.WorkerPods, Observed.by_state): which pods each group holds, and that no
policy of the planner sorts them again by itself, where two policies could disagree about which pods count."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from factory import NOW, failed, observed, rdzv, worker

from elasticjob import planner
from elasticjob.observe import WorkerPods

PLANNER = Path(planner.__file__).parent
# A pod's state as PodView says it: a policy reads these from Observed.by_state, not from each pod of the workers.
STATES = {"active", "live", "running", "never_ran", "exited_ok", "failed", "ended"}


@pytest.mark.parametrize("pod, groups", [
    (worker(0), {"active", "live", "running"}),
    (worker(0, "Pending", node=None), {"active", "live", "never_ran"}),
    (worker(0, "Pending", node="node-a", started=True), {"active", "live"}),  # its containers starting
    (worker(0, deleting=True), set()),  # scaled down, leaving: none, not even failed
    (worker(0, deleting=True, disruption="Evicted"), {"failed"}),  # evicted: a failure to account for
    (failed(0), {"failed"}),
    # Its agent exited and the kubelet says so before the pod's phase turns: ended, no longer running.
    (worker(0, exit_code=1), {"active"}),
    (worker(0, finished_at=NOW - timedelta(seconds=1)), {"active"}),
    (worker(0, "Succeeded", exit_code=0), {"finished"}),
    (worker(0, exit_code=0), {"active", "finished"}),  # the exit seen one status update before the phase
    (worker(0, "Unknown"), {"active", "live"}),  # its node silent: not Running as far as anyone knows
])
def test_each_pod_is_in_the_groups_its_state_says(pod, groups):
    found = WorkerPods.of([pod])
    got = {name for name in ("active", "live", "running", "never_ran", "failed") if pod in getattr(found, name)}
    assert got | ({"finished"} if found.finished else set()) == groups
    assert found.all == (pod,)


def test_failed_pods_come_by_name_and_the_store_is_no_worker():
    pods = [failed(2), rdzv(), failed(0), worker(1)]
    seen = observed(pods).by_state
    assert [p.name for p in seen.failed] == ["train-worker-0", "train-worker-2"]
    assert [p.name for p in seen.all] == ["train-worker-2", "train-worker-0", "train-worker-1"]


def test_the_observation_sorts_its_workers_once():
    seen = observed([worker(0), worker(1)])
    assert seen.by_state is seen.by_state and seen.workers is seen.workers


def state_filters(tree: ast.AST) -> list[int]:
    """Lines of comprehensions over `observed.workers` (or a `workers` list) that read a pod's state (in a
    condition, or as what they yield: `any(p.exited_ok for p in observed.workers)`)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        for generator in node.generators:
            source = generator.iter
            over_workers = (isinstance(source, ast.Attribute) and source.attr == "workers") or \
                (isinstance(source, ast.Name) and source.id == "workers")
            parts = [*generator.ifs, *([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])]
            reads = {a.attr for part in parts for a in ast.walk(part) if isinstance(a, ast.Attribute)}
            if over_workers and reads & STATES:
                found.append(node.lineno)
    return found


def test_no_planner_module_sorts_the_workers_by_state_itself():
    """Before Observed.by_state, 14 files filtered the workers by `active`, `running`, ... each its own way (one
    with its own `runs()`, where `running` tested another field)."""
    offenders = {}
    for path in sorted(PLANNER.glob("*.py")):
        tree = ast.parse(path.read_text())
        lines = state_filters(tree)
        defined = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in ("runs", "is_failed")]
        if lines or defined:
            offenders[path.name] = lines + defined
    assert offenders == {}, f"read the state from observed.by_state (observe.WorkerPods): {offenders}"
