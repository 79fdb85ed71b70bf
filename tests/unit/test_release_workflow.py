"""The release workflow (.github/workflows/release.yml) runs the same `make release` users run, into the registry
its repository names, and attests what that release printed it pushed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "release.yml"


def steps() -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["release"]["steps"]


def test_it_runs_make_release_into_the_registry_the_repository_names():
    runs = [s.get("run", "") for s in steps()]
    (release,) = [r for r in runs if "make release" in r]
    assert re.search(r'make release VERSION="\$\{\{ steps\.version\.outputs\.version \}\}" REGISTRY="\$REGISTRY"',
                     release), release
    assert yaml.safe_load(WORKFLOW.read_text())["jobs"]["release"]["env"]["REGISTRY"] == "${{ vars.RELEASE_REGISTRY }}"


def test_each_attestation_and_sbom_is_of_an_image_the_release_step_printed():
    used = [s for s in steps() if str(s.get("uses", "")).startswith(("anchore/sbom-action", "actions/attest"))]
    assert len(used) == 4
    for step in used:
        subject = " ".join(str(v) for v in step["with"].values())
        assert "steps.release.outputs." in subject, step


def test_it_names_no_host():
    """Where the images go and where torch comes from are the repository's variables."""
    text = WORKFLOW.read_text()
    assert not re.search(r"\b[a-z0-9-]+\.(io|com|org|dev)\b", text), re.findall(r"\b[a-z0-9-]+\.(?:io|com|org|dev)\b", text)
