"""Kueue for the tests that queue jobs: the add-on, a ClusterQueue (and flavor) per test, priority classes.

The objects are cluster-scoped: each test gets its own, named after its namespace, and they are deleted after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
LOCAL_QUEUE = "lq"


def start_kueue(cluster) -> None:
    if cluster.kind != "local":
        pytest.skip("the Kueue add-on runs on the local cluster")
    from localcluster import controlplane

    controlplane.ensure_up(ROOT, cluster.nodes or 0, addons=["kueue"])


def queued(manifest: dict, queue: str = LOCAL_QUEUE, priority: str | None = None) -> dict:
    labels = manifest["metadata"].setdefault("labels", {})
    labels[QUEUE_LABEL] = queue
    if priority:
        labels[PRIORITY_LABEL] = priority
    return manifest


class Queues:
    """ClusterQueues (with their own flavor), a LocalQueue `lq` in the test's namespace, priority classes."""

    def __init__(self, kube, namespace: str):
        from localcluster import kueue_addon

        self.kube, self.namespace, self.addon = kube, namespace, kueue_addon
        self.custom = client.CustomObjectsApi(kube)
        self.created: list[tuple[str, str]] = []  # (plural, name), deleted in reverse

    def make(self, cpu: str, memory: str = "8Gi", node_labels: dict[str, str] | None = None,
             gpus: int | None = None) -> str:
        """A ClusterQueue for this namespace with `cpu`, `memory` (and `gpus`) of one flavor; returns its name."""
        name = f"cq-{self.namespace}"[:63]
        flavor = self.addon.FLAVOR
        if node_labels:
            flavor = f"fl-{self.namespace}"[:63]
            body = {**self.addon.resource_flavor(flavor), "spec": {"nodeLabels": node_labels}}
            self.custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", body)
            self.created.append(("resourceflavors", flavor))
        self.addon.ensure_cluster_queue(self.kube, name, cpu=cpu, memory=memory, namespaces=[self.namespace],
                                        flavor=flavor, gpus=gpus)
        self.created.append(("clusterqueues", name))
        self.addon.ensure_local_queue(self.kube, self.namespace, LOCAL_QUEUE, name)
        return name

    def priority(self, name: str, value: int) -> str:
        """A WorkloadPriorityClass (Kueue's own: it orders and preempts workloads, not pods)."""
        full = f"{name}-{self.namespace}"[:63]
        self.custom.create_cluster_custom_object(GROUP, VERSION, "workloadpriorityclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkloadPriorityClass", "metadata": {"name": full},
            "value": value})
        self.created.append(("workloadpriorityclasses", full))
        return full

    def workload(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "workloads", name)

    def cleanup(self) -> None:
        delete_cluster_scoped(self.custom, self.created)


def delete_cluster_scoped(custom, created: list[tuple[str, str]]) -> None:
    """Kueue's cluster-scoped objects a test made, newest first (a ClusterQueue before its flavor); gone is fine."""
    for plural, name in reversed(created):
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as err:
            if err.status != 404:
                raise


@pytest.fixture(scope="module")
def kueue(cluster) -> None:
    """The Kueue add-on on the running cluster, for a module that imports this fixture."""
    start_kueue(cluster)


@pytest.fixture
def queues(kueue, kube, namespace) -> Iterator[Queues]:
    made = Queues(kube, namespace)
    yield made
    made.cleanup()


def conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


Check = Callable[[dict], bool]


def requested_cpu(core: client.CoreV1Api, namespace: str) -> float:
    """CPU the namespace's live ElasticJob pods ask for, scheduled or not: each pod the larger of its containers'
    sum and any init container's (as the scheduler and Kueue count a pod). Not the operator's own pods, which the
    chart may install in the same namespace (two replicas by default) and which no ClusterQueue charges."""
    def cpu(container) -> float:
        return float(parse_quantity(((container.resources and container.resources.requests) or {}).get("cpu", "0")))

    total = 0.0
    for pod in core.list_namespaced_pod(namespace, label_selector="elasticjob.dev/job-name").items:
        if pod.metadata.deletion_timestamp is None and pod.status.phase in ("Pending", "Running"):
            total += max([sum(cpu(c) for c in pod.spec.containers), *(cpu(c) for c in pod.spec.init_containers or [])])
    return total


class QuotaWatch:
    """Samples, from start() to stop(), the CPU the namespace's live pods request: the most it saw is `worst`."""

    def __init__(self, core: client.CoreV1Api, namespace: str, quota: str, every: float = 0.2):
        self.core, self.namespace, self.quota, self.every = core, namespace, float(parse_quantity(quota)), every
        self.worst, self.samples, self._stop = 0.0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> QuotaWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.worst = max(self.worst, requested_cpu(self.core, self.namespace))
            self.samples += 1
