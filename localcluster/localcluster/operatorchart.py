"""The operator installed by its Helm chart on the local cluster, with real Helm (helm-python-sdk, Helm v4's Go
SDK), as a platform team installs it: the Deployment, ServiceAccount, RBAC, rendezvous key Secret and metrics
Service all come from charts/elasticjob-operator, and its CRDs from the chart's crds/.

On real nodes the chart comes from the local registry as an OCI chart (`publish`: `helm package` and `helm push
oci://127.0.0.1:5001/elasticjob/charts`, the registry's push side; then `helm install` of
oci://10.244.0.1:5000/elasticjob/charts/elasticjob-operator:<version>@<digest> through its read-only side), and
the operator runs from its image, pulled from the registry with the pull secret (`registry_values`). On
process-backed nodes the image is ignored as for every pod there: the node agent runs what the Dockerfile's
ENTRYPOINT declares (`elasticjob run`) with the Deployment's args, from the host's .venv
(localcluster/images.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python.registry import RegistryClient
from kubernetes import client

from localcluster import registry
from localcluster.layout import Layout

ROOT = Path(__file__).resolve().parents[2]

CHART = ROOT / "charts" / "elasticjob-operator"
RELEASE, NAMESPACE = "elasticjob-operator", "elasticjob-system"
CHART_NAME = "elasticjob-operator"


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    revision: int
    installed: bool  # False: an existing release was upgraded
    crds_applied: bool  # the CRDs were in the cluster already and were applied from crds/ (Helm never upgrades them)

    @property
    def fullname(self) -> str:
        """The chart's `fullname` helper: the release name when it contains the chart's name."""
        return self.name if CHART_NAME in self.name else f"{self.name}-{CHART_NAME}"

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/name={CHART_NAME},app.kubernetes.io/instance={self.name}"


@dataclass(frozen=True)
class Published:
    """The chart in the local registry, installed by its digest (`pinned`): a tag can be pushed over."""

    ref: str
    version: str
    digest: str

    @property
    def pinned(self) -> str:
        """`oci://host/path/chart:version@sha256:...`: Helm checks the digest of what it pulls."""
        return f"{self.ref}:{self.version}@{self.digest}"


def registry_client(root: Path = ROOT) -> RegistryClient:
    """A Helm registry client with the local registry's credentials (its auth file, written at its start)."""
    return RegistryClient(credentials_file=registry.files(Layout(root)).auth)


def in_child(action: str, **arguments: Any) -> Any:
    """Runs `action` of this module in a child process that trusts the local cluster's CA: Go (Helm's SDK is a Go
    shared library) reads SSL_CERT_DIR from the environment the process started with, never from a later
    os.environ, and has no other way to be given a CA for a registry."""
    certs = registry.files(Layout(ROOT)).certs
    env = {**os.environ, "SSL_CERT_DIR": f"{os.environ.get('SSL_CERT_DIR') or '/etc/ssl/certs'}:{certs}"}
    result = subprocess.run([sys.executable, "-m", "localcluster.operatorchart", action, json.dumps(arguments)],
                            env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"helm {action} with the local registry failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def publish(root: Path = ROOT, chart: Path = CHART) -> Published:
    """`helm package charts/elasticjob-operator` (or another copy of the chart: an earlier commit's, previous.py)
    and `helm push` to the local registry (which must run), under the version its Chart.yaml names."""
    return Published(**in_child("publish", root=str(root), chart=str(chart)))


def _publish_here(root: str, chart: str = str(CHART)) -> dict[str, str]:
    version = str(yaml.safe_load((Path(chart) / "Chart.yaml").read_text())["version"])
    with registry_client(Path(root)) as helm_client, tempfile.TemporaryDirectory(prefix="elasticjob-chart-") as scratch:
        archive = helm.chart.package(chart, destination=scratch)
        helm_client.push(archive, registry.PUSH_CHARTS)  # and pulled through the read-only side
        ref = f"{registry.CHARTS}/{CHART_NAME}"
        digest = str(helm_client.resolve(f"{ref}:{version}")["digest"])
    return {"ref": ref, "version": version, "digest": digest}


def registry_values(secret: str = registry.PULL_SECRET) -> dict[str, Any]:
    """The chart's values for images in the local registry: the operator's (the kit's with it) pulled with the
    pull secret, which the job pods get too."""
    return {"image": {"repository": f"{registry.REPOSITORY}/elasticjob-operator"},
            "imagePullSecrets": [{"name": secret}], "jobImagePullSecrets": [{"name": secret}]}


def install_or_upgrade(kubeconfig: Path, values: dict[str, Any], release: str = RELEASE,
                       namespace: str = NAMESPACE, timeout: int = 180, chart: Published | None = None,
                       crds: Path = CHART) -> Release:
    """`helm upgrade --install --wait` of the chart in the repository, or of `chart` from its registry: a first
    install creates the namespace and installs crds/; an upgrade first applies crds/ itself, as
    docs/operations.md tells users to (Helm leaves existing CRDs alone). `crds` is the chart directory whose crds/
    those are: the published chart's own (an earlier commit's chart brings its own CRDs, previous.py)."""
    if chart:
        fields = in_child("install", kubeconfig=str(kubeconfig), values=values, release=release, namespace=namespace,
                          timeout=timeout, source=chart.pinned, crds=str(crds))
        return Release(**fields)
    return _install_here(str(kubeconfig), values, release, namespace, timeout, crds=str(crds))


def _install_here(kubeconfig_path: str, values: dict[str, Any], release: str, namespace: str, timeout: int,
                  source: str = str(CHART), crds: str = str(CHART)) -> Release:
    kubeconfig = Path(kubeconfig_path)
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace) as cfg:
        if source.startswith("oci://"):
            cfg.set_registry_client(registry_client())
        exists = release_exists(cfg, release)
        if exists:
            crds_applied = apply_crds(kubeconfig, chart=Path(crds))
            result = cfg.upgrade(source, release, values, namespace=namespace, wait="watcher", timeout=timeout)
        else:
            crds_applied = apply_crds(kubeconfig, only_existing=True, chart=Path(crds))
            result = cfg.install(source, release, values, namespace=namespace, create_namespace=True,
                                 wait="watcher", timeout=timeout)
    return Release(release, namespace, int(result["revision"]), not exists, crds_applied)


def ensure_pull_secret(api: client.ApiClient, namespace: str, password: str) -> None:
    """The namespace, and the local registry's pull secret in it, before anything there pulls an image."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as err:
        if err.status != 409:
            raise
    secret = registry.pull_secret(namespace, password)
    try:
        core.create_namespaced_secret(namespace, secret)
    except client.ApiException as err:
        if err.status != 409:
            raise
        core.replace_namespaced_secret(registry.PULL_SECRET, namespace, secret)


def release_exists(cfg: helm.Config, release: str) -> bool:
    try:
        cfg.status(release)
        return True
    except helm.HelmNotFoundError:
        return False


def uninstall(kubeconfig: Path, release: str = RELEASE, namespace: str = NAMESPACE, timeout: int = 120) -> None:
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace) as cfg:
        cfg.uninstall(release, wait="watcher", timeout=timeout)


def chart_crds(chart: Path = CHART) -> list[dict]:
    return [doc for path in sorted((chart / "crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def apply_crds(kubeconfig: Path, only_existing: bool = False, chart: Path = CHART) -> bool:
    """Server-side apply of the chart's CRDs (all, or only those already in the cluster, which Helm would skip),
    taking their fields over from whoever set them (`kubectl apply --server-side --force-conflicts`: Helm created
    them). Returns whether any was applied."""
    from kubernetes import config

    with config.new_client_from_config(config_file=str(kubeconfig)) as api:
        ext = client.ApiextensionsV1Api(api)
        present = {crd.metadata.name for crd in ext.list_custom_resource_definition().items}
        applied = False
        for doc in chart_crds(chart):
            if only_existing and doc["metadata"]["name"] not in present:
                continue
            ext.patch_custom_resource_definition(doc["metadata"]["name"], doc, field_manager="elasticjob-chart",
                                                 force=True, _content_type="application/apply-patch+yaml")
            applied = True
        return applied


def operator_pods(core: client.CoreV1Api, release: Release) -> list[client.V1Pod]:
    """The release's operator pods that are not being deleted."""
    pods = core.list_namespaced_pod(release.namespace, label_selector=release.selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def wait_running(core: client.CoreV1Api, release: Release, timeout: float = 120) -> client.V1Pod:
    """The one operator pod of the release, running (every other one gone)."""
    deadline, seen = time.monotonic() + timeout, "nothing"
    while time.monotonic() < deadline:
        every = core.list_namespaced_pod(release.namespace, label_selector=release.selector).items
        running = [p for p in every if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        if len(every) == 1 and running:
            return running[0]
        seen = [(p.metadata.name, p.status.phase, bool(p.metadata.deletion_timestamp)) for p in every]
        time.sleep(0.5)
    raise TimeoutError(f"the operator pod of {release.name} is not running alone after {timeout:.0f}s: {seen}")


if __name__ == "__main__":  # in_child's other end: one action, its result as JSON on the last line
    action, arguments = sys.argv[1], json.loads(sys.argv[2])
    if action == "publish":
        print(json.dumps(_publish_here(**arguments)))
    else:
        print(json.dumps(_install_here(arguments.pop("kubeconfig"), **arguments).__dict__))
