"""Kueue's manager on the local cluster, and helpers for tests that queue work through it.

What `up --kueue` sets up (prepare, then start, then finish):
- certificates from the local PKI: the webhook server's (SAN IP:127.0.0.1) and a client certificate for the user
  `kueue-manager`, bound to Kueue's own manager ClusterRole (manifests/kueue/manager-role.yaml);
- the 11 CRDs, five of them with Kueue's conversion webhook (`url: https://127.0.0.1:<port>/convert`) as upstream's
  kustomize patches them;
- kueue-manager in a private mount namespace whose /etc is an overlay holding kueue/metrics/certs/tls.{crt,key}:
  with internalCertManagement off, Kueue v0.19.2 exits unless that hard-coded path exists. The overlay lives and
  dies with the process; the host's /etc is not touched;
- once Kueue serves, its webhooks for kueue.x-k8s.io objects (url client configs, failurePolicy Fail), then
  ResourceFlavor `default-flavor`, ClusterQueue `cluster-queue` (quota = the nodes' allocatable cpu and memory)
  and LocalQueue `user-queue` in `default`, and waits until the ClusterQueue is Active.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from localcluster import apply, components
from localcluster import pki as pki_mod
from localcluster.health import api_json
from localcluster.layout import Endpoints

NAME = "kueue"
BINARY = "kueue-manager"
PORTS = {"kueue-webhook": 9443, "kueue-health": 8081}
HEALTHY_WITHIN = 90.0
CONFIG_TEMPLATE = Path(__file__).resolve().parents[1] / "kueue" / "config.yaml"
NAMESPACE = "kueue-system"
USER = "kueue-manager"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
# The CRDs upstream's config/components/crd/kustomization.yaml gives a conversion webhook.
CONVERTED = {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}
# Where Kueue v0.19.2 insists on finding its metrics certificates (cmd/kueue/main.go).
METRICS_CERTS = Path("kueue/metrics/certs")
FLAVOR = "default-flavor"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"

Log = Callable[[str], None]


# ---------------------------------------------------------------- files


def _dir(endpoints: Endpoints) -> Path:
    return endpoints.layout.addon_dir(NAME)


def _kubeconfig(endpoints: Endpoints) -> Path:
    return endpoints.layout.kubeconfigs / "kueue.yaml"


def config(ports: dict[str, int], cert_dir: Path) -> dict:
    """The checked-in configuration with this cluster's ports and certificate directory."""
    data = yaml.safe_load(CONFIG_TEMPLATE.read_text())
    data["webhook"]["port"] = ports["kueue-webhook"]
    data["webhook"]["certDir"] = str(cert_dir)
    data["health"]["healthProbeBindAddress"] = f"127.0.0.1:{ports['kueue-health']}"
    return data


def _write_certs(pki: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for suffix, name in (("crt", "tls.crt"), ("key", "tls.key")):
        shutil.copyfile(pki / f"kueue-webhook.{suffix}", target / name)
        (target / name).chmod(0o600)


def _write_files(endpoints: Endpoints) -> None:
    layout, base = endpoints.layout, _dir(endpoints)
    pki_mod.ensure_pki(layout.pki)
    components.write_kubeconfig(_kubeconfig(endpoints), endpoints.server, layout.pki, "kueue", USER)
    _write_certs(layout.pki, base / "certs")
    _write_certs(layout.pki, base / "etc-upper" / METRICS_CERTS)
    # overlayfs wants an empty work dir on the upper dir's filesystem; a crashed run may have left one.
    shutil.rmtree(base / "etc-work", ignore_errors=True)
    (base / "etc-work").mkdir()
    (base / "config.yaml").write_text(yaml.safe_dump(config(endpoints.ports, base / "certs"), sort_keys=False))


# ---------------------------------------------------------------- objects


def _ca_bundle(endpoints: Endpoints) -> str:
    return base64.b64encode((endpoints.layout.pki / "ca.crt").read_bytes()).decode()


def _webhook_url(endpoints: Endpoints, path: str) -> str:
    return f"https://127.0.0.1:{endpoints.ports['kueue-webhook']}{path}"


def crds(endpoints: Endpoints) -> list[dict]:
    result = []
    for path in sorted((endpoints.layout.manifests / "kueue").glob("kueue.x-k8s.io_*.yaml")):
        for crd in apply.load_all(path):
            if crd["spec"]["names"]["plural"] in CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": _webhook_url(endpoints, "/convert"), "caBundle": _ca_bundle(endpoints)}}}
            result.append(crd)
    return result


def rbac(manifests: Path) -> list[dict]:
    """Kueue's manager ClusterRole and its Role for Secrets in its namespace, as upstream generates them, bound to
    the user `kueue-manager`; plus reading ElasticJobs (an external framework)."""
    (role,) = apply.load_all(manifests / "kueue" / "manager-role.yaml")
    role["metadata"]["name"] = "kueue-manager-role"
    role["rules"].append({"apiGroups": ["elasticjob.dev"], "resources": ["elasticjobs"],
                          "verbs": ["get", "list", "watch"]})
    (secrets,) = apply.load_all(manifests / "kueue" / "manager-secrets-role.yaml")
    secrets["metadata"] = {"name": "kueue-manager-secrets-role", "namespace": NAMESPACE}
    subjects = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]
    bindings = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "kueue-manager-rolebinding"}, "subjects": subjects,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kueue-manager-role"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "kueue-manager-secrets-rolebinding", "namespace": NAMESPACE}, "subjects": subjects,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kueue-manager-secrets-role"}},
    ]
    return [role, secrets, *bindings]


def webhook_configurations(endpoints: Endpoints) -> list[dict]:
    """Upstream's webhook list cut to the kueue.x-k8s.io webhooks (no integration's), called by URL."""
    result = []
    for config_obj in apply.load_all(endpoints.layout.manifests / "kueue" / "webhook-manifests.yaml"):
        hooks = []
        for hook in config_obj["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if "-kueue-x-k8s-io-" not in path:
                continue
            hook = dict(hook, clientConfig={"url": _webhook_url(endpoints, path), "caBundle": _ca_bundle(endpoints)})
            hooks.append(hook)
        kind = config_obj["kind"]
        name = "kueue-mutating-webhooks" if kind.startswith("Mutating") else "kueue-validating-webhooks"
        result.append({"apiVersion": config_obj["apiVersion"], "kind": kind, "metadata": {"name": name},
                       "webhooks": hooks})
    return result


def resource_flavor(name: str = FLAVOR) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": name}}


def cluster_queue(name: str, cpu: str, memory: str, *, namespaces: list[str] | None = None,
                  flavor: str = FLAVOR, gpus: int | None = None) -> dict:
    """A ClusterQueue with nominal quota on cpu and memory in one flavor; `namespaces` None admits from every
    namespace. Within the queue, a higher-priority workload preempts lower-priority ones."""
    selector = {} if namespaces is None else {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}]}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": selector,
                     "preemption": {"withinClusterQueue": "LowerPriority"},
                     "resourceGroups": [quota_group(cpu, memory, flavor, gpus)]}}


def quota_group(cpu: str, memory: str, flavor: str = FLAVOR, gpus: int | None = None) -> dict:
    """Quota on cpu and memory, and on `nvidia.com/gpu` when `gpus` is given (the real nodes' fake GPUs)."""
    resources = [{"name": "cpu", "nominalQuota": str(cpu)}, {"name": "memory", "nominalQuota": str(memory)}]
    if gpus is not None:
        resources.append({"name": "nvidia.com/gpu", "nominalQuota": str(gpus)})
    return {"coveredResources": [r["name"] for r in resources], "flavors": [{"name": flavor, "resources": resources}]}


def local_queue(namespace: str, name: str = LOCAL_QUEUE, cluster_queue_name: str = CLUSTER_QUEUE) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue_name}}


def nodes_allocatable(endpoints: Endpoints) -> tuple[str, str]:
    """(cpu, memory) the registered nodes offer together, e.g. ("24", "48Gi")."""
    from kubernetes.utils.quantity import parse_quantity

    cpu = memory = 0
    for node in api_json(endpoints, "/api/v1/nodes").get("items", []):
        allocatable = node.get("status", {}).get("allocatable", {})
        cpu += parse_quantity(allocatable.get("cpu", "0"))
        memory += parse_quantity(allocatable.get("memory", "0"))
    gib, rest = divmod(int(memory), 2**30)
    return f"{cpu.normalize():f}", f"{gib}Gi" if not rest else f"{int(memory) // 2**20}Mi"


# ---------------------------------------------------------------- lifecycle (see addons.py)


def prepare(endpoints: Endpoints) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("Kueue needs root here: it runs in a private mount namespace "
                           "(see localcluster/kueue_addon.py)")
    _write_files(endpoints)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    definitions = crds(endpoints)
    for obj in [namespace, *rbac(endpoints.layout.manifests), *definitions]:
        apply.apply(endpoints, obj)
    apply.wait_established(endpoints, [crd["metadata"]["name"] for crd in definitions])


def argv(bin_dir: Path, endpoints: Endpoints) -> list[str]:
    base = _dir(endpoints)
    overlay = f"lowerdir=/etc,upperdir={base / 'etc-upper'},workdir={base / 'etc-work'}"
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t overlay overlay -o {overlay} /etc && exec "$0" "$@"',
        str(bin_dir / BINARY), f"--config={base / 'config.yaml'}", f"--kubeconfig={_kubeconfig(endpoints)}",
    ]


def _active(endpoints: Endpoints, name: str) -> bool:
    queue = api_json(endpoints, f"/apis/{GROUP}/{VERSION}/clusterqueues/{name}")
    conditions = (queue.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)


def finish(endpoints: Endpoints, log: Log) -> None:
    """Webhooks, then the default flavor and queues; returns once the ClusterQueue is Active (Kueue reconciles)."""
    for obj in webhook_configurations(endpoints):
        apply.apply(endpoints, obj)
    cpu, memory = nodes_allocatable(endpoints)
    for obj in (resource_flavor(), cluster_queue(CLUSTER_QUEUE, cpu, memory), local_queue("default")):
        apply.apply(endpoints, obj)
    deadline = time.monotonic() + 60
    while not _active(endpoints, CLUSTER_QUEUE):
        if time.monotonic() > deadline:
            raise RuntimeError(f"ClusterQueue {CLUSTER_QUEUE} not Active after 60s; "
                               f"see {endpoints.layout.log_file(NAME)}")
        time.sleep(0.2)
    log(f"  kueue: ClusterQueue {CLUSTER_QUEUE} (cpu {cpu}, memory {memory}) Active, LocalQueue default/{LOCAL_QUEUE}")


# ---------------------------------------------------------------- for tests (any cluster running Kueue)


def _custom(api):
    from kubernetes import client

    return client.CustomObjectsApi(api)


def ensure_cluster_queue(api, name: str, cpu: str, memory: str, *, namespaces: list[str] | None = None,
                         flavor: str = FLAVOR, gpus: int | None = None) -> dict:
    """Creates or updates (server-side apply) a ClusterQueue; `api` is a kubernetes.client.ApiClient.
    The flavor must exist (`default-flavor` does on the local cluster)."""
    body = cluster_queue(name, cpu, memory, namespaces=namespaces, flavor=flavor, gpus=gpus)
    return _custom(api).patch_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", name, body, field_manager="localcluster-tests", force=True,
        _content_type="application/apply-patch+yaml")


def set_cluster_queue_quota(api, cpu: str, memory: str, name: str = CLUSTER_QUEUE, flavor: str = FLAVOR) -> dict:
    """Replaces a ClusterQueue's quota with `cpu` and `memory` of one flavor, leaving the rest of its spec."""
    return _custom(api).patch_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", name, {"spec": {"resourceGroups": [quota_group(cpu, memory, flavor)]}},
        _content_type="application/merge-patch+json")


def ensure_local_queue(api, namespace: str, name: str = LOCAL_QUEUE, cluster_queue_name: str = CLUSTER_QUEUE) -> dict:
    """Creates or updates a LocalQueue in `namespace` pointing at a ClusterQueue."""
    return _custom(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "localqueues", name, local_queue(namespace, name, cluster_queue_name),
        field_manager="localcluster-tests", force=True, _content_type="application/apply-patch+yaml")
