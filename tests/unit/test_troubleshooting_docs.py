"""docs/troubleshooting.md keeps up with the code: every metric elasticjob.metrics registers is in its metrics
table with its type and labels, every reason the operator writes on a job (its phase, its conditions, its
Events, status.lastFailures) is in its reasons table, and neither table lists what the code no longer has.

The reasons are read from the operator's source with ast: the string literals that reach the reason argument
of the calls that write one (enter_phase, set_condition, Plan.warn/normal, Event, ...), followed through the
helpers that pass their own `reason` parameter on, through local names and module constants.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from elasticjob import metrics
from elasticjob.observe import DISRUPTION_REASONS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCE = ROOT / "operator" / "elasticjob"

# The calls that write a reason, and where its argument is (position without self; or the keyword `reason`).
SINKS = {"enter_phase": 3, "set_condition": 3, "warn": 0, "normal": 0, "Event": 1, "WarmStarts": 1}
KEYWORD_SINKS = {"FailureRecord", "AvoidedNode"}  # (reason=...): status.lastFailures, status.avoidedNodes
# Reasons the source holds in a value rather than a literal, each documented another way: a new dynamic site
# fails the test until it is looked at and added here (with where its values come from).
DYNAMIC = {
    ("planner/failures.py", "pod.disruption"),  # observe.DISRUPTION_REASONS' values, added below
    ("planner/failures.py", "pod.reason"),  # the kubelet's own reason of a pod (OOMKilled, Error, ...)
    ("planner/recovery.py", "warm.reason"),  # kit.warm_starts: the WarmStarts(...) literals
    ("controller/apply.py", "reason"),  # merged(): Events already planned, joined per reason
}


@dataclass
class Reasons:
    found: set[str] = field(default_factory=set)
    dynamic: set[tuple[str, str]] = field(default_factory=set)


def parse_all() -> dict[str, ast.Module]:
    return {str(p.relative_to(SOURCE)): ast.parse(p.read_text(), str(p)) for p in sorted(SOURCE.rglob("*.py"))}


def callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    return names[1:] if names[:1] == ["self"] else names


def reason_arg(call: ast.Call, sinks: dict[str, int | str]) -> ast.expr | None:
    where = sinks.get(callee(call) or "")
    if where is None:
        return None
    keyword = next((k.value for k in call.keywords if k.arg == (where if isinstance(where, str) else "reason")),
                   None)
    if keyword is not None or isinstance(where, str):
        return keyword
    return call.args[where] if where < len(call.args) else None


def all_sinks(trees: dict[str, ast.Module]) -> dict[str, int | str]:
    """SINKS, and every function that passes one of its own parameters on as a reason (queued, record_failure):
    its callers' values are the reasons, not the parameter's name."""
    sinks: dict[str, int | str] = {**SINKS, **{name: "reason" for name in KEYWORD_SINKS}}
    grew = True
    while grew:
        grew = False
        for tree in trees.values():
            for func in functions(tree):
                names = params(func)
                for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
                    arg = reason_arg(call, sinks)
                    for name in value_names(arg):
                        if name in names and func.name not in sinks:
                            sinks[func.name] = names.index(name)
                            grew = True
    return sinks


def value_names(expr: ast.expr | None) -> Iterator[str]:
    """The names whose value the expression can be (`reason`, `reason if active else ...`), not those it
    merely uses (a condition, a call's arguments)."""
    if isinstance(expr, ast.Name):
        yield expr.id
    elif isinstance(expr, ast.IfExp):
        yield from value_names(expr.body)
        yield from value_names(expr.orelse)
    elif isinstance(expr, ast.BoolOp):
        for each in expr.values:
            yield from value_names(each)


def constants(trees: dict[str, ast.Module]) -> dict[str, str]:
    """Module-level NAME = "literal" of the package (UNCONFIRMED = "Unconfirmed")."""
    found = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


class Resolver:
    """The literals an expression at a reason argument can take, within the function it is in."""

    def __init__(self, trees: dict[str, ast.Module], sinks: dict[str, int | str]) -> None:
        self.defs = {f.name: f for tree in trees.values() for f in functions(tree)}
        self.consts = constants(trees)
        self.sinks, self.path = sinks, ""
        self.reasons = Reasons()

    def values(self, expr: ast.expr, func: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            self.reasons.found.add(expr.value)
        elif isinstance(expr, ast.IfExp):
            self.values(expr.body, func)
            self.values(expr.orelse, func)
        elif isinstance(expr, ast.BoolOp):
            for each in expr.values:
                self.values(each, func)
        elif isinstance(expr, ast.JoinedStr):
            self.f_string(expr, func)
        elif isinstance(expr, (ast.Name, ast.Attribute)):
            self.name(expr, func)
        else:
            self.reasons.dynamic.add((self.path, ast.unparse(expr)))

    def name(self, expr: ast.Name | ast.Attribute, func: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        key = expr.id if isinstance(expr, ast.Name) else expr.attr
        if func is not None and isinstance(expr, ast.Name):
            if func.name in self.sinks and key in params(func):
                return  # a parameter passed on: its callers' values count
            assigned = list(self.assignments(func, key))
            if assigned:
                for value in assigned:
                    self.values(value, func)
                return
        if key in self.consts:
            self.reasons.found.add(self.consts[key])
            return
        self.reasons.dynamic.add((self.path, ast.unparse(expr)))

    def assignments(self, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> Iterator[ast.expr]:
        """What `name` is assigned in func: `x = ...`, `x, y = a, b`, and `x, y = f(...)` through f's returns."""
        for node in (n for n in ast.walk(func) if isinstance(n, ast.Assign)):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    yield node.value
                elif isinstance(target, ast.Tuple):
                    spot = [i for i, t in enumerate(target.elts) if isinstance(t, ast.Name) and t.id == name]
                    if spot:
                        yield from self.element(node.value, spot[0])

    def element(self, value: ast.expr, index: int) -> Iterator[ast.expr]:
        if isinstance(value, ast.Tuple):
            yield value.elts[index]
        elif isinstance(value, ast.Call) and (callee(value) or "") in self.defs:
            for ret in (n for n in ast.walk(self.defs[callee(value) or ""]) if isinstance(n, ast.Return)):
                if isinstance(ret.value, ast.Tuple):
                    yield ret.value.elts[index]

    def f_string(self, expr: ast.JoinedStr, func: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        """f"Not{kind}" inside `for kind in ("Running", ...)`: each of them."""
        parts = expr.values
        loops = [n for n in ast.walk(func) if isinstance(n, ast.For)] if func else []
        if len(parts) == 2 and isinstance(parts[0], ast.Constant) and isinstance(parts[1], ast.FormattedValue) \
                and isinstance(parts[1].value, ast.Name):
            var = parts[1].value.id
            for loop in loops:
                if isinstance(loop.target, ast.Name) and loop.target.id == var \
                        and isinstance(loop.iter, (ast.Tuple, ast.List)):
                    self.reasons.found.update(str(parts[0].value) + str(e.value) for e in loop.iter.elts
                                              if isinstance(e, ast.Constant))
                    return
        self.reasons.dynamic.add((self.path, ast.unparse(expr)))


def enclosing(tree: ast.Module) -> dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Each node's innermost function."""
    owner: dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for func in functions(tree):  # outer functions come first in ast.walk: inner ones overwrite
        for node in ast.walk(func):
            owner[node] = func
    return owner


@functools.cache
def code_reasons() -> Reasons:
    trees = parse_all()
    sinks = all_sinks(trees)
    resolver = Resolver(trees, sinks)
    for path, tree in trees.items():
        resolver.path = path
        owner = enclosing(tree)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            arg = reason_arg(call, sinks)
            if arg is not None:
                resolver.values(arg, owner.get(call))
    resolver.reasons.found |= set(DISRUPTION_REASONS.values())
    return resolver.reasons


# --- the page -------------------------------------------------------------------------------------------------


def table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under `## heading`, header and rule left out."""
    text = PAGE.read_text()
    start = text.index(f"\n## {heading}\n")
    section = text[start:].split("\n## ")[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def code_spans(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name as scraped -> (type, labels), for every metric elasticjob.metrics defines (prometheus_client keeps the
    labels only on the wrapper: a labelled metric has no sample, hence no label, before its first use)."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            kind = str(value._type)
            name = f"{value._name}_total" if kind == "counter" else str(value._name)
            found[name] = (kind, tuple(value._labelnames))
    return found


def documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = table("Metrics")
    return {row[0].strip("`"): (row[1], tuple(sorted(code_spans(row[2])))) for row in rows}


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    code = {name: (kind, tuple(sorted(labels))) for name, (kind, labels) in registered().items()}
    assert code, "no metric found in elasticjob.metrics"
    page = documented_metrics()
    missing = {name: code[name] for name in sorted(code.keys() - page.keys())}
    assert not missing, f"metrics in elasticjob.metrics, not in docs/troubleshooting.md's table: {missing}"
    stale = sorted(page.keys() - code.keys())
    assert not stale, f"metrics in docs/troubleshooting.md's table that elasticjob.metrics no longer has: {stale}"
    wrong = {name: {"page": page[name], "code": code[name]} for name in sorted(code) if page[name] != code[name]}
    assert not wrong, f"type or labels differ: {wrong}"


def test_every_reason_the_code_writes_is_documented() -> None:
    found = code_reasons().found
    documented = set().union(*(code_spans(row[0]) for row in table("Reasons")))
    missing = sorted(found - documented)
    assert not missing, f"reasons the operator writes, not in docs/troubleshooting.md's table: {missing}"
    stale = sorted(documented - found)
    assert not stale, f"reasons in docs/troubleshooting.md's table that the code no longer writes: {stale}"


def test_no_reason_comes_from_an_unknown_value() -> None:
    """A reason the parse cannot follow to literals is one the table may miss: look where it comes from."""
    unknown = sorted(code_reasons().dynamic - DYNAMIC)
    assert not unknown, f"reasons from values the parse cannot follow (path, expression): {unknown}"


@pytest.mark.parametrize("reason", ["MaxRestartsExceeded", "KueueAbsent", "Preempted", "NotRunning", "Killed",
                                    "Unconfirmed", "NodeLost", "KitLauncher", "RoundCompleted", "FailedCreate"])
def test_the_parse_finds_reasons_of_each_kind(reason: str) -> None:
    """Reasons reached each way: a literal, a tuple assignment, a helper's parameter, an f-string over a loop,
    a function's returned tuple, a module constant, a table of observe, a constructor, the controller."""
    assert reason in code_reasons().found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_page_reaches_a_heading() -> None:
    """The page points into the other docs rather than copying them: a renamed section must not leave it
    pointing nowhere."""
    broken = []
    for target, anchor in re.findall(r"\]\(([\w./-]*?)(?:#([\w-]+))?\)", PAGE.read_text()):
        path = PAGE.parent / target if target else PAGE
        if not path.exists():
            broken.append(target)
        elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}:
            broken.append(f"{target}#{anchor}")
    assert not broken, f"links of docs/troubleshooting.md that reach nothing: {broken}"
