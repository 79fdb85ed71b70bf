"""The image builder's pure half: cache keys, the files an image is keyed by, buildah's arguments, preflight."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster.imagebuild import plan

ROOT = Path(__file__).resolve().parents[2]
OPERATOR, WORKER = plan.IMAGES


def test_cache_key_separates_names_from_contents() -> None:
    assert plan.cache_key([("a", b"bc")]) != plan.cache_key([("ab", b"c")])
    assert plan.cache_key([("a", b"1"), ("b", b"2")]) != plan.cache_key([("a", b"1b"), ("", b"2")])
    assert plan.cache_key([("a", b"1")]) == plan.cache_key([("a", b"1")])


def test_copy_sources_skip_other_stages_and_options() -> None:
    text = ("FROM x AS build\nCOPY pyproject.toml README.md ./\nCOPY --chown=1:1 operator/ operator/\n"
            "FROM x\nCOPY --from=build /wheels /wheels\nADD a.txt /a\n")
    assert plan.copy_sources(text) == ["pyproject.toml", "README.md", "operator", "a.txt"]


def test_the_worker_image_is_keyed_by_what_it_copies() -> None:
    sources = plan.copy_sources((ROOT / WORKER.dockerfile).read_text())
    ignore = plan.dockerignore_patterns((ROOT / ".dockerignore").read_text())
    files = {str(p.relative_to(ROOT)) for p in plan.context_files(ROOT, sources, ignore)}
    assert "examples/train_ddp.py" in files
    assert "operator/elasticjob_store/__main__.py" in files
    assert not any("__pycache__" in f or f.startswith("operator/elasticjob/") for f in files)


@pytest.mark.parametrize(("path", "expected"), [
    ("operator/elasticjob_store/__pycache__/x.pyc", True),
    ("operator/elasticjob_operator.egg-info/PKG-INFO", True),
    ("tests/unit/test_x.py", True),
    ("build", True),
    ("operator/build.py", False),
    ("operator/elasticjob_store/__main__.py", False),
    ("examples/tests.py", False),
])
def test_dockerignore_keeps_the_same_files_out_of_the_key(path: str, expected: bool) -> None:
    patterns = plan.dockerignore_patterns("# comment\n.git\n**/__pycache__\n**/*.egg-info\nbuild\ntests/\n")
    assert plan.ignored(Path(path), patterns) is expected


def _tree(root: Path) -> Path:
    (root / "images").mkdir()
    (root / "images" / "w.Dockerfile").write_text("FROM b\nCOPY src/ /src/\n")
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("one")
    (root / "other.py").write_text("not copied")
    (root / ".dockerignore").write_text("**/*.log\n")
    (root / "src" / "debug.log").write_text("ignored")
    return root


def test_image_key_changes_with_copied_files_base_and_wheels_only(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    spec = plan.ImageSpec("w", "t", "images/w.Dockerfile", "BASE", smoke=())
    key = plan.image_key(spec, root, "base1", ["x.whl"], "d1")
    (root / "other.py").write_text("changed, but no image copies it")
    assert plan.image_key(spec, root, "base1", ["x.whl"], "d1") == key
    (root / "src" / "debug.log").write_text("the context leaves it out")
    assert plan.image_key(spec, root, "base1", ["x.whl"], "d1") == key
    (root / "src" / "a.py").write_text("two")
    changed = plan.image_key(spec, root, "base1", ["x.whl"], "d1")
    assert changed != key
    assert plan.image_key(spec, root, "base2", ["x.whl"], "d1") != changed
    assert plan.image_key(spec, root, "base1", ["y.whl"], "d1") != changed
    assert plan.image_key(spec, root, "base1", ["x.whl"], "d2") != changed


def test_arg_default_and_final_user() -> None:
    text = 'ARG A="1"\nARG B\nFROM x AS build\nUSER 1\nFROM y\nARG TORCH_VERSION=2.13.0\nUSER 65532:65532\n'
    assert plan.arg_default(text, "A") == "1"
    assert plan.arg_default(text, "B") is None
    assert plan.arg_default(text, "TORCH_VERSION") == "2.13.0"
    assert plan.final_user(text) == "65532:65532"
    assert plan.final_user("FROM x\nUSER 1\nFROM y\n") is None


@pytest.mark.parametrize("spec", plan.IMAGES, ids=lambda s: s.name)
def test_each_image_runs_as_the_user_its_spec_says(spec: plan.ImageSpec) -> None:
    user = plan.final_user((ROOT / spec.dockerfile).read_text())
    non_root = bool(user) and user.split(":")[0] not in ("0", "root")
    assert non_root == spec.non_root


@pytest.mark.parametrize("spec", plan.IMAGES, ids=lambda s: s.name)
def test_only_the_base_argument_differs_from_a_real_build(spec: plan.ImageSpec) -> None:
    """The builder overrides the ARG the Dockerfile declares for its base, and nothing else."""
    text = (ROOT / spec.dockerfile).read_text()
    assert plan.arg_default(text, spec.base_arg)
    argv = plan.bud_argv(Path("/s"), spec, "localhost/base:k", ROOT, Path("/wh"), Path("/tw"), Path("/pc"))
    build_args = [argv[i + 1] for i, word in enumerate(argv) if word == "--build-arg"]
    assert build_args == [f"{spec.base_arg}=localhost/base:k"]
    assert argv[:7] == ["buildah", "--root", "/s/root", "--runroot", "/s/run", "--storage-driver", "overlay"]
    assert argv[argv.index("--isolation") + 1] == "chroot"
    assert "/pc:/etc/pip.conf:ro" in argv and f"/tw:{plan.TORCH_MOUNT}:ro" in argv
    assert argv[-1] == str(ROOT)


def test_pip_reads_only_the_mounted_wheels() -> None:
    conf = plan.pip_conf()
    assert "no-index = true" in conf
    assert plan.WHEELHOUSE_MOUNT in conf and plan.TORCH_MOUNT in conf


def test_the_archive_names_the_image_as_docker_would_tag_it() -> None:
    argv = plan.push_argv(Path("/s"), OPERATOR, Path("/c/op.tar"))
    ref = f"elasticjob-operator:{plan.VERSION}"
    assert argv[-2:] == [f"localhost/{ref}", f"docker-archive:/c/op.tar:{ref}"]


def test_requirements_skip_extras() -> None:
    metadata = ("Name: torch\nRequires-Dist: filelock\nRequires-Dist: sympy>=1.13.3\n"
                'Requires-Dist: optree>=0.13.0; extra == "optree"\n'
                'Requires-Dist: triton==3; platform_system == "Linux"\n')
    assert plan.requires_dist(metadata) == ["filelock", "sympy>=1.13.3", 'triton==3; platform_system == "Linux"']
    pyproject = '[build-system]\nrequires = ["setuptools>=69"]\n[project]\ndependencies = ["kopf>=1.45"]\n'
    assert plan.project_requirements(pyproject) == ["setuptools>=69", "kopf>=1.45"]


def _preflight(euid: int = 0, have: tuple[str, ...] = ("buildah", "mmdebstrap"), wheels: int = 1,
               python: tuple[int, int] = plan.PYTHON_VERSION) -> str | None:
    found = [Path("/w/torch.whl")] * wheels
    return plan.preflight(euid, lambda p: f"/usr/bin/{p}" if p in have else None, Path("/w"), found, "2.13.0",
                          python)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, None),
    ({"euid": 1000}, "not root"),
    ({"have": ("mmdebstrap",)}, "buildah is absent: `apt-get install buildah`"),
    ({"have": ("buildah",)}, "mmdebstrap is absent"),
    ({"wheels": 0}, "no torch wheel torch-2.13.0+cpu-cp311-cp311-*.whl in /w"),
    ({"python": (3, 12)}, "python 3.12 runs the builder"),
])
def test_preflight_names_the_first_missing_prerequisite(kwargs: dict, expected: str | None) -> None:
    problem = _preflight(**kwargs)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "\n" not in problem
