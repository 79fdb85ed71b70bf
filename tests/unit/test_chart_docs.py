"""The chart configuration table in docs/operations.md is generated from values.yaml and must not drift."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "charts"))

import values_table  # noqa: E402


def test_docs_table_matches_values_yaml():
    doc = values_table.DOC.read_text()
    assert values_table.doc_with_table(doc) == doc, "run `python charts/values_table.py`"


def test_every_value_is_described():
    text = values_table.VALUES.read_text()
    missing = [path for path, _, note in values_table.rows(yaml.safe_load(text), values_table.comments_by_key(text))
               if not note]
    assert not missing, f"values without a comment above them: {missing}"
