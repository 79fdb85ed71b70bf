"""Two distributions: the operator's (pyproject.toml: the operator and the programs of the job's pods, what the
operator's image installs) and the local cluster's (localcluster/pyproject.toml: the local cluster, the demo and its
story, with rich). Each wheel is built here from what its build reads, the operator's from exactly the files
images/operator.Dockerfile copies, and read back: a package missing from a wheel imports on the host (the editable
install finds it in the folder) but not in the image, whose pod then crash-loops; one too many puts the local
cluster into the operator's image."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from localcluster.imagebuild import plan

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = ROOT / "images" / "operator.Dockerfile"


def packages_under(source: Path) -> set[str]:
    """Dotted names of the packages (folders with an __init__.py) under a source folder."""
    return {".".join(init.parent.relative_to(source).parts) for init in source.rglob("__init__.py")
            if not any(part.endswith(".egg-info") or part == "__pycache__" for part in init.parts)}


def build_wheel(source: Path, out: Path) -> zipfile.ZipFile:
    # No build isolation: the venv's setuptools builds it, so the test needs no package index.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def copy_into(files: list[Path], root: Path, target: Path) -> None:
    for path in files:
        destination = target / path.relative_to(root)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def wheel_packages(wheel: zipfile.ZipFile) -> set[str]:
    return {name.removesuffix("/__init__.py").replace("/", ".") for name in wheel.namelist()
            if name.endswith("/__init__.py")}


def metadata(wheel: zipfile.ZipFile, suffix: str) -> str:
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/" + suffix)]
    return wheel.read(name).decode()


@pytest.fixture(scope="module")
def operator_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The operator's wheel, built from the image's build context: what the Dockerfile copies, less .dockerignore."""
    context = tmp_path_factory.mktemp("operator-context")
    ignore = plan.dockerignore_patterns((ROOT / ".dockerignore").read_text())
    copy_into(plan.context_files(ROOT, plan.copy_sources(OPERATOR_DOCKERFILE.read_text()), ignore), ROOT, context)
    return build_wheel(context, tmp_path_factory.mktemp("operator-wheel"))


@pytest.fixture(scope="module")
def localcluster_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("localcluster-source")
    project = ROOT / "localcluster"
    files = [project / "pyproject.toml", project / "README.md",
             *(p for p in (project / "localcluster").rglob("*.py") if "__pycache__" not in p.parts)]
    copy_into(files, project, source)
    return build_wheel(source, tmp_path_factory.mktemp("localcluster-wheel"))


def test_the_operator_wheel_holds_every_package_under_operator(operator_wheel: zipfile.ZipFile) -> None:
    missing = packages_under(ROOT / "operator") - wheel_packages(operator_wheel)
    assert missing == set(), "[tool.setuptools.packages.find] in pyproject.toml leaves these out"
    names = set(operator_wheel.namelist())
    assert {"elasticjob/pod_template_schema.json", "elasticjob_kit/launch.sh"} <= names, "package data"


def test_the_operator_wheel_holds_no_local_cluster(operator_wheel: zipfile.ZipFile) -> None:
    assert [n for n in operator_wheel.namelist() if n.startswith("localcluster")] == []
    assert "localcluster" not in metadata(operator_wheel, "entry_points.txt")
    requirements = plan.requires_dist(metadata(operator_wheel, "METADATA"))
    assert requirements, "the wheel's METADATA lists its requirements"
    assert [r for r in requirements if r.startswith("rich")] == [], "rich is the demo's, not the operator's"


def test_the_operator_image_copies_no_local_cluster() -> None:
    sources = plan.copy_sources(OPERATOR_DOCKERFILE.read_text())
    assert "operator" in sources
    assert [s for s in sources if s.startswith("localcluster")] == []


def test_the_image_builds_wheelhouse_covers_the_operator_wheel(operator_wheel: zipfile.ZipFile) -> None:
    """imagebuild downloads the wheelhouse from pyproject.toml's requirements; the image's pip installs the wheel
    from that wheelhouse alone (no index), so the wheel may require nothing more."""
    def normal(requirements: list[str]) -> set[str]:
        return {str(Requirement(r)) for r in requirements}  # "kopf>=1.45,<2" and METADATA's "kopf<2,>=1.45" alike

    wheelhouse = normal(plan.project_requirements((ROOT / "pyproject.toml").read_text()))
    assert normal(plan.requires_dist(metadata(operator_wheel, "METADATA"))) <= wheelhouse


def test_the_localcluster_wheel_holds_its_packages_and_rich(localcluster_wheel: zipfile.ZipFile) -> None:
    found = {f"localcluster.{name}" if name else "localcluster"
             for name in packages_under(ROOT / "localcluster" / "localcluster")}
    assert wheel_packages(localcluster_wheel) == found
    requirements = plan.requires_dist(metadata(localcluster_wheel, "METADATA"))
    assert any(r.startswith("rich") for r in requirements)
    assert any(r.startswith("elasticjob-operator") for r in requirements)
    assert "localcluster = localcluster.cli:main" in metadata(localcluster_wheel, "entry_points.txt")


def test_no_package_of_the_operator_may_import_the_local_cluster() -> None:
    """import-linter's contract names the packages one by one: every top-level package under operator/ is one."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"]
                  if c["type"] == "forbidden" and c["forbidden_modules"] == ["localcluster"]]
    top_level = {name for name in packages_under(ROOT / "operator") if "." not in name}
    assert set(contract["source_modules"]) == top_level
