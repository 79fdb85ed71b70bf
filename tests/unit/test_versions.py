"""One version number: the chart's version and appVersion, the operator's package and the images `make images`
tags agree, and the chart's default operator image is the one `make images` pushes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import helm_python as helm
import yaml

from localcluster import registry, version
from localcluster.imagebuild import plan

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "elasticjob-operator"


def chart_metadata() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def test_the_chart_version_app_version_and_package_version_agree() -> None:
    meta = chart_metadata()
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert meta["version"] == meta["appVersion"] == package == version.VERSION


def test_make_images_tags_every_image_with_the_version() -> None:
    tags = {spec.name: spec.tag for spec in plan.IMAGES}
    assert tags == {"elasticjob-operator": version.VERSION, "elasticjob-worker": f"{version.VERSION}-cpu"}


def test_the_charts_default_image_is_the_one_make_images_pushes() -> None:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({"image": {"repository": f"{registry.REPOSITORY}/elasticjob-operator"}},
                                 name="ej", namespace="ops", is_install=True)
    deployment = next(doc for path, text in manifests.items() if path.endswith(".yaml")
                      for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    [operator] = [spec for spec in plan.IMAGES if spec.name == "elasticjob-operator"]
    assert container["image"] == f"{registry.REPOSITORY}/{operator.ref}" == registry.image("elasticjob-operator")


def test_a_release_chart_carries_its_version_and_pins_its_image_by_digest(tmp_path: Path) -> None:
    from localcluster import release

    digest = "sha256:" + "cd" * 32
    chart = release.release_chart(CHART, tmp_path, "1.2.3", "reg.example/ml/elasticjob-operator", digest)
    with helm.Chart.load(chart) as loaded:
        assert (loaded.metadata["version"], loaded.metadata["appVersion"]) == ("1.2.3", "1.2.3")
        manifests = loaded.render(None, name="ej", namespace="ops", is_install=True)
    deployment = next(doc for path, text in manifests.items() if path.endswith(".yaml")
                      for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"reg.example/ml/elasticjob-operator:1.2.3@{digest}"
