"""An integration is a package behind a narrow interface (elasticjob/integrations.py): no module of the operator
outside its package names its types or imports it, except the registry. import-linter checks the imports
(pyproject.toml); this checks the names too, module by module, so that a type re-exported or passed around under
another module's name is caught as well."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "elasticjob"
INTEGRATIONS = ("kueue", "gang")
REGISTRY = OPERATOR / "integrations.py"


def integration_types() -> dict[str, str]:
    """Every class an integration's package defines, by name: the package it is in."""
    found = {}
    for package in INTEGRATIONS:
        for path in sorted((OPERATOR / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    found[node.name] = package
    return found


def outside_modules() -> list[Path]:
    inside = [OPERATOR / package for package in INTEGRATIONS]
    return [p for p in sorted(OPERATOR.rglob("*.py"))
            if p != REGISTRY and not any(p.is_relative_to(folder) for folder in inside)]


def trespasses(path: Path, types: dict[str, str]) -> list[str]:
    """Where the module imports an integration's package or names one of its types."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        found += [f"l.{node.lineno}: imports {m}" for m in modules
                  if any(m == f"elasticjob.{p}" or m.startswith(f"elasticjob.{p}.") for p in INTEGRATIONS)]
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in types:
            found.append(f"l.{node.lineno}: names {types[name]}'s {name}")
    return found


def test_the_integrations_define_types_to_guard():
    types = integration_types()
    assert {"PatchWorkload", "ApplyWorkloadStatus", "WorkloadView", "PodGroupView", "AdmissionStatus",
            "PatchPodGroup"} <= set(types)


@pytest.mark.parametrize("path", outside_modules(), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_no_module_outside_an_integration_names_it(path):
    assert trespasses(path, integration_types()) == []


@pytest.mark.parametrize("path", outside_modules(), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_no_module_outside_kueue_reads_writes_or_shows_its_status(path):
    """Kueue's part of the status (status.admission) is Kueue's to read, write and show: the core learns what it
    needs through the seam (Allowance.note, Plan.preempted), keeps the part unread (models.StatusPart), and the CRD
    gets its schema and `kubectl get` columns from the registry (crd.crd(integrations.status_parts())). Before,
    the models defined it, crd.py named its columns, and the ledger, the phase and planner/base.py read it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "admission":
            found.append(f"l.{node.lineno}: .admission")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ".status.admission" in node.value:
            found.append(f"l.{node.lineno}: {node.value!r}")
    assert found == []
