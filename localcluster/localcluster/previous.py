"""An earlier commit's operator in the local registry, for the upgrade test (tests/e2e/test_upgrade.py): the chart
and operator image a user installed before, which `helm upgrade` then moves to the current ones.

    python -m localcluster.previous [--from REF]    # builds and pushes (once per commit); prints what it pushed

1. The commit's source tree, by `git archive` into the cache (no worktree: the checkout is shared and stays
   untouched), once per commit.
2. Its operator image, built by imagebuild from that tree (its own Dockerfile, pyproject and operator/; the base,
   torch wheel and builder are today's) and pushed to the local registry as `elasticjob-operator:<v>-g<sha7>`,
   `<v>` the commit's own appVersion. Only the operator's image: the job's worker image stays the current one (any
   worker image with Python and torch runs under any operator), and the kit comes from the operator's image.
3. Its chart as `make release` would have published it: version and appVersion `<v>-g<sha7>` (never the current
   chart's version, which the same registry holds), its image pinned by the digest just pushed
   (release.release_chart), pushed beside the current chart.

The commit is ELASTICJOB_UPGRADE_FROM or DEFAULT_FROM: the last commit before the operator's Lease (5be0588), so
the upgrade crosses a real change (kopf peering and a Recreate Deployment of one replica, to a Lease and a rolling
update of two) besides every change to the job's pods and status since. Its chart predates jobImagePullSecrets, so
its job pods pull with their template's imagePullSecrets (the store pod takes the template's).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import operatorchart, registry, release
from localcluster.imagebuild import build, plan, push
from localcluster.layout import Layout

ROOT = Path(__file__).resolve().parents[2]
# d5c6899 "Clean exits": the parent of 5be0588 (leader election on a Lease replaces kopf peering).
DEFAULT_FROM = "d5c6899c878eb11e75fbeb810812d0df6e34a0cd"
ENV = "ELASTICJOB_UPGRADE_FROM"
CACHE = Path(os.environ.get("ELASTICJOB_CACHE") or Path.home() / ".cache" / "elasticjob")
CHART_DIR = Path("charts") / "elasticjob-operator"
OPERATOR = "elasticjob-operator"


@dataclass(frozen=True)
class Previous:
    sha: str
    version: str  # the chart's version and the operator image's tag: <appVersion>-g<sha7>
    tree: Path  # the commit's files
    image: str  # the operator image's reference, pinned: <repository>:<version>@<digest>
    chart: operatorchart.Published

    @property
    def crds(self) -> Path:
        """The chart directory whose crds/ this release installs (operatorchart.install_or_upgrade's `crds`)."""
        return self.tree / CHART_DIR


def wanted_ref(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(ENV) or DEFAULT_FROM


def resolve(ref: str, root: Path = ROOT) -> str:
    """The commit's full sha; a ref the checkout does not have fails with git's words."""
    result = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=root,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise ValueError(f"{ENV}={ref}: no such commit in {root}")
    return result.stdout.strip()


def version_of(app_version: str, sha: str) -> str:
    """`0.1.0` at commit d5c6899... -> `0.1.0-gd5c6899`: a SemVer pre-release (Helm's chart versions) and an OCI
    tag (no `+`), sorting before the release it led to; the `g` keeps an all-digit sha a valid identifier (SemVer
    forbids leading zeros in numeric ones), as `git describe` does."""
    base = app_version.split("-", 1)[0]
    version = f"{base}-g{sha[:7]}"
    if not release.SEMVER.match(version):
        raise ValueError(f"appVersion {app_version!r} at {sha[:7]} gives {version!r}, not SemVer")
    return version


def app_version(tree: Path) -> str:
    return str(yaml.safe_load((tree / CHART_DIR / "Chart.yaml").read_text())["appVersion"])


def chart_values(namespace: str, pull_secret: str = registry.PULL_SECRET) -> dict[str, Any]:
    """The earlier chart's values for one watched namespace: its operator image (pinned in the chart) pulled with
    the pull secret. Nothing else: only keys every chart since the registry-less ones knows (their schema refuses
    unknown keys), and its own defaults for the rest (one replica), as its users had it."""
    return {"watch": {"allNamespaces": False, "namespaces": [namespace]},
            "imagePullSecrets": [{"name": pull_secret}]}


def operator_spec(version: str) -> plan.ImageSpec:
    """imagebuild's operator image under the earlier version's tag (same Dockerfile path and smoke checks)."""
    (spec,) = [s for s in plan.IMAGES if s.name == OPERATOR]
    return dataclasses.replace(spec, tag=version)


def source_tree(sha: str, root: Path = ROOT, cache: Path = CACHE) -> Path:
    """The commit's files under the cache (made once: written aside and renamed into place)."""
    tree = cache / "previous" / sha
    if tree.exists():
        return tree
    partial = tree.with_name(f".partial-{sha}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        archive = subprocess.run(["git", "archive", "--format=tar", sha], cwd=root, capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(tree)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return tree


def torch_wheel(root: Path = ROOT) -> Path:
    """The CPU torch wheel imagebuild uses (its --torch-wheels default): the wheelhouse's requirements come from
    its metadata."""
    wheels_dir = Path(os.environ.get("ELASTICJOB_TORCH_WHEELS", root.parent / "shared" / "wheels")).resolve()
    version = plan.arg_default((root / "images" / "worker-cpu.Dockerfile").read_text(), "TORCH_VERSION") or "?"
    wheels = sorted(wheels_dir.glob(plan.torch_wheel_pattern(version)))
    problem = plan.preflight(os.geteuid(), shutil.which, wheels_dir, wheels, version, sys.version_info[:2])
    if problem:
        raise RuntimeError(f"cannot build the earlier operator image: {problem}")
    return wheels[-1]


def build_and_push(tree: Path, version: str, log: build.Log) -> tuple[str, str]:
    """The tree's operator image built (cached by its inputs, as imagebuild caches) and pushed to the local
    registry: (reference, digest)."""
    layout = Layout(ROOT)
    if not registry.running(layout):
        raise RuntimeError(f"no local registry answers at {registry.ADDRESS}: `make cluster-up REAL_NODES=1`")
    spec, cache = operator_spec(version), CACHE / "images"
    (tarball,) = build.build_all(build.Inputs(tree, cache, torch_wheel(), log), (spec,))
    digests = push.push_all([(spec, tarball)], push.local_target(layout), cache, log)
    ref = push.reference(registry.REPOSITORY, spec)
    return ref, digests[ref]


def prepare(ref: str | None = None, log: build.Log | None = None) -> Previous:
    """The earlier commit's image and chart in the local registry (built and pushed where they are not yet)."""
    say = log or (lambda line: print(f"[previous] {line}", file=sys.stderr, flush=True))
    sha = resolve(ref or wanted_ref())
    tree = source_tree(sha)
    version = version_of(app_version(tree), sha)
    say(f"{sha[:7]}: operator image and chart {version}")
    image, digest = build_and_push(tree, version, say)
    with tempfile.TemporaryDirectory(prefix="elasticjob-previous-") as scratch:
        chart = release.release_chart(tree / CHART_DIR, Path(scratch), version, image.rsplit(":", 1)[0], digest)
        published = operatorchart.publish(ROOT, chart=chart)
    return Previous(sha, version, tree, f"{image}@{digest}", published)


def to_json(previous: Previous) -> str:
    fields = {**dataclasses.asdict(previous), "tree": str(previous.tree)}
    return json.dumps(fields)


def from_json(text: str) -> Previous:
    fields = json.loads(text)
    return Previous(**{**fields, "tree": Path(fields["tree"]),
                       "chart": operatorchart.Published(**fields["chart"])})


def prepare_in_child(ref: str | None = None) -> Previous:
    """prepare() in a child process (`python -m localcluster.previous --json`): the build's programs write to the
    child's stderr, a real file whatever the caller did with sys.stderr (pytest replaces it)."""
    argv = [sys.executable, "-m", "localcluster.previous", "--json", *(["--from", ref] if ref else [])]
    result = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} failed (exit {result.returncode}); its stderr says why")
    return from_json(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.previous", description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="ref", help=f"commit or tag (default: ${ENV}, else {DEFAULT_FROM[:7]})")
    parser.add_argument("--json", action="store_true", help="print what it pushed as one JSON line")
    args = parser.parse_args(argv)
    previous = prepare(args.ref)
    if args.json:
        print(to_json(previous))
    else:
        print(f"image {previous.image}\nchart {previous.chart.pinned}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
