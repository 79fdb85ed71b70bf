"""No per-job state at module level in the operator: what a reconcile must remember lives in the job's status (the
replica that takes over the Lease goes on from it) or on an object the process shell owns and hands down. A
module-level container under a lower-case name is state; upper-case names are constants (never written)."""

from __future__ import annotations

import ast
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "elasticjob"
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "WeakValueDictionary"}
# What this process told Prometheus, by job: the fleet gauge moves by one job's change (metrics._move). Metrics
# are the process's own; the replica that takes over starts from zero and counts each job as it reconciles it.
ALLOWED = {("metrics.py", "_phases")}


def mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in MUTABLE_CALLS
    return False


def module_state(path: Path) -> list[str]:
    found = []
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and not target.id.startswith("__") \
                    and not target.id.lstrip("_").isupper() and mutable(node.value):
                found.append(target.id)
    return found


def test_no_module_of_the_operator_keeps_state_at_module_level():
    found = [(str(path.relative_to(OPERATOR)), name) for path in sorted(OPERATOR.rglob("*.py"))
             for name in module_state(path)]
    assert ("metrics.py", "_phases") in found  # the walk sees what it should
    assert [f for f in found if f not in ALLOWED] == []
