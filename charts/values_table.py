"""Generates the chart's configuration table (docs/operations.md) from values.yaml: its defaults and the
comment lines right above each key. `python charts/values_table.py` rewrites the table between the markers in
docs/operations.md; tests/unit/test_chart_docs.py fails when the two drift."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "charts" / "elasticjob-operator" / "values.yaml"
DOC = ROOT / "docs" / "operations.md"
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
# Maps whose keys are the user's own (labels, resources...) are one row, not one row per key.
WHOLE = {"resources", "podSecurityContext", "securityContext", "serviceMonitor.labels", "dashboard.labels"}
_KEY = re.compile(r"^(\s*)([A-Za-z][\w.-]*):")


def comments_by_key(text: str) -> dict[str, str]:
    found, pending, stack = {}, [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# "))
            continue
        match = _KEY.match(line)
        if not match:
            pending = [] if not stripped else pending
            continue
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2)]
        if pending:
            found[".".join(stack)] = " ".join(pending)
        pending = []
    return found


def rows(values: dict, comments: dict[str, str], prefix: str = "") -> list[tuple[str, str, str]]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not any(path.endswith(w) for w in WHOLE):
            out += rows(value, comments, f"{path}.")
        else:
            out.append((path, json.dumps(value), comments.get(path, "")))
    return out


def table() -> str:
    text = VALUES.read_text()
    comments = comments_by_key(text)
    lines = ["| value | default | description |", "|---|---|---|"]
    lines += [f"| `{path}` | `{default}` | {note} |" for path, default, note in rows(yaml.safe_load(text), comments)]
    return "\n".join(lines)


def doc_with_table(doc: str) -> str:
    before, rest = doc.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{table()}\n{END}{after}"


if __name__ == "__main__":
    DOC.write_text(doc_with_table(DOC.read_text()))
    sys.exit(0)
