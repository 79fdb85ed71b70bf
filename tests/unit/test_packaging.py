"""The wheel the images install holds every package of the operator and of the pods' programs: pyproject.toml lists
them by hand, and a package left out imports on the host (an editable install finds it in the folder) but not in
the operator's image, whose pod then crash-loops."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_under_operator_is_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    source = ROOT / "operator"
    found = {".".join(init.parent.relative_to(source).parts) for init in source.rglob("__init__.py")
             if not any(part.endswith(".egg-info") or part == "__pycache__" for part in init.parts)}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
