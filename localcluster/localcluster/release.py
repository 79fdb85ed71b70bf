"""`make release VERSION=x.y.z REGISTRY=host/path`: the images and the chart of one version, in a registry.

    python -m localcluster.release --version X.Y.Z --registry HOST/PATH [--dry-run]

1. The images (imagebuild, buildah) tagged X.Y.Z (the operator) and X.Y.Z-cpu (the CPU worker), pushed to
   HOST/PATH with buildah's login (`buildah login HOST` first).
2. The chart packaged with version and appVersion X.Y.Z, its default image HOST/PATH/elasticjob-operator pinned by
   the digest just pushed (image.digest: the operator, and the kit every job pod copies from it, are exactly that
   content whatever the tag later names), pushed as oci://HOST/PATH/charts/elasticjob-operator with Helm's login
   (`helm registry login HOST`, or the same Docker config.json).
Prints what it pushed: `helm install elasticjob-operator oci://HOST/PATH/charts/elasticjob-operator --version X.Y.Z`.

`--registry local` releases into the local cluster's registry (which must run): pushed through its push side,
named as pods and Helm pull them, through its read-only side (registry.REPOSITORY, registry.CHARTS). That is how
tests/e2e/test_upgrade.py installs and upgrades released versions.

The CUDA worker image is not built here: its base cannot be pulled where only package registries are reachable;
`docker build -f images/worker.Dockerfile` builds it where that base can be pulled. The examples run PyTorch's
public image, so no job needs this project's worker image.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "elasticjob-operator"
SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")


def release_chart(source: Path, destination: Path, version: str, repository: str, digest: str) -> Path:
    """A copy of the chart at `version`, its default image `repository@digest`; values.yaml edited in place of
    its two lines so that its comments (the docs table's source) stay."""
    chart = destination / source.name
    shutil.copytree(source, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    text = (chart / "Chart.yaml").read_text()
    text = re.sub(r"^version: .*$", f"version: {version}", text, count=1, flags=re.M)
    text = re.sub(r"^appVersion: .*$", f'appVersion: "{version}"', text, count=1, flags=re.M)
    (chart / "Chart.yaml").write_text(text)
    values = (chart / "values.yaml").read_text()
    values = re.sub(r"^  repository: .*$", f"  repository: {repository}", values, count=1, flags=re.M)
    values = re.sub(r'^  digest: ""$', f'  digest: "{digest}"', values, count=1, flags=re.M)
    (chart / "values.yaml").write_text(values)
    assert meta["name"] == source.name
    return chart


LOCAL = "local"  # --registry local: the local cluster's registry


def push_images(version: str, registry: str) -> dict[str, str]:
    """imagebuild --push (--push-local for LOCAL): {reference as pulled: digest}."""
    where = ["--push-local"] if registry == LOCAL else ["--push", registry]
    out = subprocess.run([sys.executable, "-m", "localcluster.imagebuild", *where, "--version", version],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
    return dict(line.split("@", 1) for line in out.split() if "@" in line)


def release_local(version: str) -> int:
    """The images and the chart in the local cluster's registry; the chart pushed by operatorchart.publish (a
    child process that trusts the cluster's CA, with the push side's login)."""
    from localcluster import operatorchart, registry

    digests = push_images(version, LOCAL)
    operator = f"{registry.REPOSITORY}/elasticjob-operator"
    with tempfile.TemporaryDirectory(prefix="elasticjob-release-") as scratch:
        chart = release_chart(CHART, Path(scratch), version, operator, digests[f"{operator}:{version}"])
        published = operatorchart.publish(chart=chart)
    for ref, each in digests.items():
        print(f"pushed {ref}@{each}")
    print(f"pushed {published.pinned}\n"
          f"helm install elasticjob-operator {published.ref} --version {version}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.release", description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--registry", required=True, help="host[:port]/path the images and the chart go to; "
                        f"'{LOCAL}': the local cluster's registry")
    args = parser.parse_args(argv)
    if not SEMVER.match(args.version):
        parser.error(f"--version {args.version}: not x.y.z (Helm wants SemVer)")
    if args.registry == LOCAL:
        return release_local(args.version)
    registry = args.registry.removeprefix("oci://").rstrip("/")
    digests = push_images(args.version, registry)
    operator = f"{registry}/elasticjob-operator"
    digest = digests[f"{operator}:{args.version}"]
    import helm_python as helm
    from helm_python.registry import RegistryClient

    with tempfile.TemporaryDirectory(prefix="elasticjob-release-") as scratch:
        chart = release_chart(CHART, Path(scratch), args.version, operator, digest)
        archive = helm.chart.package(str(chart), destination=scratch)
        with RegistryClient() as client:
            client.push(archive, f"oci://{registry}/charts")
    for ref, each in digests.items():
        print(f"pushed {ref}@{each}")
    print(f"pushed oci://{registry}/charts/elasticjob-operator:{args.version}\n"
          f"helm install elasticjob-operator oci://{registry}/charts/elasticjob-operator --version {args.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
