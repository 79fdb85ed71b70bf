"""The earlier commit's chart and image for the upgrade test (localcluster/previous.py): which commit, the version
it is published under, its source tree, and its chart as published, rendered by Helm with the test's values.
Nothing is built here (the image build needs buildah and root: tests/e2e/test_upgrade.py runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from localcluster import previous, registry, release
from localcluster.imagebuild import plan

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("app_version", "sha", "expected"), [
    ("0.1.0", "d5c6899c878eb11e75fbeb810812d0df6e34a0cd", "0.1.0-gd5c6899"),
    # An all-digit short sha with a leading zero would be an invalid SemVer identifier without the g.
    ("0.1.0", "0123456" + "0" * 33, "0.1.0-g0123456"),
    ("0.2.0-rc.1", "abcdef0" + "0" * 33, "0.2.0-gabcdef0"),
])
def test_the_earlier_version_is_a_semver_pre_release_naming_the_commit(app_version: str, sha: str,
                                                                       expected: str) -> None:
    version = previous.version_of(app_version, sha)
    assert version == expected
    assert release.SEMVER.match(version) and "+" not in version  # an OCI tag has no '+'


def test_a_version_that_is_not_semver_is_refused() -> None:
    with pytest.raises(ValueError, match="not SemVer"):
        previous.version_of("dev", "d5c6899c878eb11e75fbeb810812d0df6e34a0cd")


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, previous.DEFAULT_FROM),
    ({previous.ENV: ""}, previous.DEFAULT_FROM),
    ({previous.ENV: "v0.1.0"}, "v0.1.0"),
])
def test_the_commit_is_the_environment_s_or_the_pinned_one(environ: dict[str, str], expected: str) -> None:
    assert previous.wanted_ref(environ) == expected


def test_refs_resolve_to_commits_and_a_missing_one_says_so() -> None:
    assert previous.resolve(previous.DEFAULT_FROM) == previous.DEFAULT_FROM
    assert previous.resolve(previous.DEFAULT_FROM[:7]) == previous.DEFAULT_FROM
    with pytest.raises(ValueError, match=previous.ENV):
        previous.resolve("no-such-ref-anywhere")


def test_the_operator_image_is_imagebuild_s_under_the_earlier_tag() -> None:
    (current,) = [s for s in plan.IMAGES if s.name == "elasticjob-operator"]
    spec = previous.operator_spec("0.1.0-gd5c6899")
    assert spec.ref == "elasticjob-operator:0.1.0-gd5c6899"
    assert (spec.dockerfile, spec.smoke, spec.base_arg) == (current.dockerfile, current.smoke, current.base_arg)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return previous.source_tree(previous.DEFAULT_FROM, cache=tmp_path_factory.mktemp("cache"))


def test_the_source_tree_is_the_commit_s_and_made_once(tree: Path) -> None:
    assert previous.app_version(tree) == "0.1.0"
    assert (tree / "images" / "operator.Dockerfile").is_file() and (tree / "operator" / "elasticjob").is_dir()
    marker = tree / "marker"
    marker.write_text("kept")
    assert previous.source_tree(previous.DEFAULT_FROM, cache=tree.parents[1]) == tree
    assert marker.exists(), "the tree was extracted again"
    marker.unlink()
    assert not list(tree.parent.glob(".partial-*"))


def render(chart: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(chart) as loaded:
        manifests = loaded.render(values, name="ej", namespace="team", is_install=True)
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def test_the_earlier_chart_as_published_runs_its_pinned_image_without_a_lease(tree: Path, tmp_path: Path) -> None:
    version = previous.version_of(previous.app_version(tree), previous.DEFAULT_FROM)
    repository = f"{registry.REPOSITORY}/elasticjob-operator"
    chart = release.release_chart(tree / previous.CHART_DIR, tmp_path, version, repository, DIGEST)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == (version, version)
    docs = render(chart, previous.chart_values("team"))  # Helm checks the values against the chart's schema
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    image = f"{repository}:{version}@{DIGEST}"
    assert container["image"] == image
    assert container["args"][container["args"].index("--kit-image") + 1] == image  # the kit is the same image
    assert pod["imagePullSecrets"] == [{"name": registry.PULL_SECRET}]
    assert container["args"][:2] == ["--namespace", "team"]
    # What the upgrade crosses: one standalone replica, never overlapping its successor, and no Lease.
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    assert "--leader-elect" not in container["args"]


def test_the_earlier_chart_refuses_what_it_does_not_know(tree: Path) -> None:
    """Its schema is strict: values of the current chart it never had fail its install, so chart_values names
    none of them."""
    with pytest.raises(Exception, match="jobImagePullSecrets"):
        render(tree / previous.CHART_DIR, {**previous.chart_values("team"), "jobImagePullSecrets": [{"name": "x"}]})


def test_what_the_child_pushed_reads_back_whole(tmp_path: Path) -> None:
    chart = previous.operatorchart.Published(f"{registry.CHARTS}/elasticjob-operator", "0.1.0-gd5c6899", DIGEST)
    pushed = previous.Previous(previous.DEFAULT_FROM, "0.1.0-gd5c6899", tmp_path, f"r/o:0.1.0-gd5c6899@{DIGEST}", chart)
    line = previous.to_json(pushed)
    assert "\n" not in line and previous.from_json(line) == pushed
    assert pushed.crds == tmp_path / "charts" / "elasticjob-operator"
