"""The README's chart configuration table is generated from values.yaml and must not drift."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "charts"))

import values_table  # noqa: E402


def test_readme_table_matches_values_yaml():
    readme = (ROOT / "README.md").read_text()
    assert values_table.readme_with_table(readme) == readme, "run `python charts/values_table.py`"


def test_every_value_is_described():
    missing = [row[0] for row in values_table.rows(
        __import__("yaml").safe_load(values_table.VALUES.read_text()),
        values_table.comments_by_key(values_table.VALUES.read_text())) if not row[2]]
    assert not missing, f"values without a comment above them: {missing}"
