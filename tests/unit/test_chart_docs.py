"""The README's chart configuration table is generated from values.yaml and must not drift."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "charts"))

import values_table  # noqa: E402


def test_readme_table_matches_values_yaml():
    readme = (ROOT / "README.md").read_text()
    assert values_table.readme_with_table(readme) == readme, "run `python charts/values_table.py`"


def test_every_value_is_described():
    text = values_table.VALUES.read_text()
    missing = [path for path, _, note in values_table.rows(yaml.safe_load(text), values_table.comments_by_key(text))
               if not note]
    assert not missing, f"values without a comment above them: {missing}"
