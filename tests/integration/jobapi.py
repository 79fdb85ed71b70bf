"""ElasticJobs and their pods through the real API server: what the integration tests create and wait on."""

from __future__ import annotations

from pathlib import Path

from kubernetes.utils import parse_quantity

from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
SLEEP = ["python", "-c", "import time; time.sleep(3600)"]
# The image every pod of these tests runs, and the pull secrets it needs. Process-backed nodes ignore images (the
# host's .venv stands in for any), so a name is enough there; real local nodes (LOCALCLUSTER_NODE_KIND=real) pull
# the worker image from the local registry, which has python and the kit's modules, as the commands here need.
# A pod that needs the kubernetes client runs the operator's image instead. Set once per session by the `pod_image`
# fixture (tests/integration/conftest.py).
POD_IMAGE = {"image": "trainer:test", "operator": "operator:test", "imagePullSecrets": []}


def use_image(image: str, operator: str, pull_secrets: list[str]) -> None:
    POD_IMAGE.update(image=image, operator=operator, imagePullSecrets=[{"name": name} for name in pull_secrets])


def pod_spec(containers: list[dict], *, operator_image: bool = False, **spec) -> dict:
    """A pod spec whose containers run the session's image (each container's own `image` is replaced)."""
    secrets = POD_IMAGE["imagePullSecrets"]
    image = POD_IMAGE["operator" if operator_image else "image"]
    return {"containers": [{**c, "image": image} for c in containers],
            **({"imagePullSecrets": list(secrets)} if secrets else {}), **spec}


def _millicores(quantity: str) -> int:
    return int(parse_quantity(quantity) * 1000)


def one_per_node_cpu(core, margin: int = 0) -> tuple[int, str]:
    """(schedulable nodes, a CPU request of which each node holds one and no node two): just over half the largest
    node's allocatable CPU (process-backed nodes have 8 CPUs each, real ones this machine's). Checked to fit beside
    what the cluster's own pods (kube-system: CoreDNS, metrics-server on real nodes) request, and `margin`
    millicores more (a job's store pod). Other tests' pods still terminating are left out: they go."""
    nodes = [n for n in core.list_node().items if not n.spec.unschedulable]
    room = {n.metadata.name: _millicores(n.status.allocatable["cpu"]) for n in nodes}
    request = max(room.values()) // 2 + 1
    for pod in core.list_namespaced_pod("kube-system").items:
        if pod.spec.node_name in room and pod.status.phase in ("Pending", "Running"):
            for container in pod.spec.containers:
                requests = (container.resources.requests or {}) if container.resources else {}
                room[pod.spec.node_name] -= _millicores(requests.get("cpu", "0"))
    assert request + margin <= min(room.values()), f"nodes too small to hold one such pod each: {room}"
    return len(nodes), f"{request}m"


def store_millicores() -> int:
    """What a job's store pod requests of CPU (the margin one_per_node_cpu leaves beside a big worker)."""
    from elasticjob.builders import STORE_RESOURCES

    return _millicores(STORE_RESOURCES["requests"]["cpu"])


def job_manifest(name: str, command=SLEEP, **spec) -> dict:
    container = {"name": "worker", "command": command,
                 "resources": spec.pop("resources", {"requests": {"cpu": "100m"}})}
    body = {"minReplicas": 1, "maxReplicas": 3, "replicas": 2, "maxRestarts": 2,
            "template": {"spec": pod_spec([container], terminationGracePeriodSeconds=3)}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {**body, **spec}}


def host_dir(namespace: str) -> Path:
    """A directory of this machine for one test, which its pods see at HOST_MOUNT (with_host_dir): a test lets its
    workers go, or counts their starts, through files there. Every local node, of either kind, runs on this
    machine and mounts it as a hostPath."""
    return Path("/tmp") / f"elasticjob-it-{namespace}"


HOST_MOUNT = "/host"


def with_host_dir(manifest: dict, namespace: str) -> dict:
    template = manifest["spec"]["template"]["spec"]
    for container in template["containers"]:
        container.setdefault("volumeMounts", []).append({"name": "host", "mountPath": HOST_MOUNT})
    template.setdefault("volumes", []).append(
        {"name": "host", "hostPath": {"path": str(host_dir(namespace)), "type": "DirectoryOrCreate"}})
    return manifest


def create(api, namespace, manifest):
    return api[0].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


def get_job(api, namespace, name):
    return api[0].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def pods(api, namespace, role="worker"):
    found = api[1].list_namespaced_pod(namespace, label_selector=f"elasticjob.dev/role={role}").items
    return sorted((p for p in found if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.name)


def status_of(api, namespace, name):
    return get_job(api, namespace, name).get("status") or {}


def wait_phase(api, namespace, name, phase, timeout=60, reason=None):
    def matches(status):
        return status.get("phase") == phase and (reason is None or status.get("reason") == reason)
    return wait_for(lambda: status_of(api, namespace, name), timeout, f"{name} in phase {phase}/{reason}",
                    until=matches)


def wait_pods(api, namespace, count, timeout=60, running=True):
    def ok(found):
        live = [p for p in found if not running or p.status.phase == "Running"]
        return len(live) == count and len(found) == count
    return wait_for(lambda: pods(api, namespace), timeout, f"{count} worker pods", until=ok)
