"""The Kueue set-up a platform team is given (examples/kueue/, docs/scheduling.md "Set up Kueue") works as shipped
on the real API server with the real Kueue (the local cluster's add-on, v0.19.2, whose webhooks validate Kueue's
objects): the example ResourceFlavor, ClusterQueue, LocalQueue and WorkloadPriorityClasses are applied, and a job
labelled with the example LocalQueue is admitted in the example ClusterQueue and runs with the flavor's placement.

What is changed from the files, and why: cluster-scoped objects get this test's namespace in their names (tests
share the cluster) and are deleted after it; the references between them follow; the LocalQueue goes into the
test's namespace, which gets the label the ClusterQueue's namespaceSelector asks for, as the example says to do;
the flavor's nodeLabels name a local node (no node here carries a GPU pool's labels). The job is a cheap one
(sleep, cpu only): the example job's GPUs and image belong on a real GPU cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobapi import create, job_manifest, pods, status_of
from kubernetes import client

from helpers import wait_for
from kueue_support import GROUP, VERSION, conditions, delete_cluster_scoped, kueue, queued  # noqa: F401 (fixtures)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kueue"
NODE = "local-node-1"
WORKER = {"requests": {"cpu": "200m", "memory": "64Mi"}}
SLEEP = ["python", "-c", "import time; time.sleep(3600)"]


def example(file: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / file).read_text()) if doc]


class ExampleQueues:
    """The example Kueue objects, applied for one test namespace; the cluster-scoped ones deleted after."""

    def __init__(self, kube, namespace: str):
        self.custom, self.core, self.namespace = client.CustomObjectsApi(kube), client.CoreV1Api(kube), namespace
        self.created: list[tuple[str, str]] = []  # (plural, name), deleted in reverse
        self.flavor, self.cluster_queue, self.local_queue = "", "", ""
        self.priorities: dict[str, str] = {}  # the example's name -> this test's

    def unique(self, name: str) -> str:
        return f"{name}-{self.namespace}"[:63]

    def create_cluster_scoped(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        self.created.append((plural, body["metadata"]["name"]))

    def apply(self) -> None:
        (flavor,) = example("resource-flavor.yaml")
        self.flavor = flavor["metadata"]["name"] = self.unique(flavor["metadata"]["name"])
        flavor["spec"]["nodeLabels"] = {"kubernetes.io/hostname": NODE}
        self.create_cluster_scoped("resourceflavors", flavor)

        (queue,) = example("cluster-queue.yaml")
        self.cluster_queue = queue["metadata"]["name"] = self.unique(queue["metadata"]["name"])
        for group in queue["spec"]["resourceGroups"]:
            for flavor_quota in group["flavors"]:
                flavor_quota["name"] = self.flavor
        self.core.patch_namespace(self.namespace, {"metadata": {"labels": queue["spec"]["namespaceSelector"][
            "matchLabels"]}})
        self.create_cluster_scoped("clusterqueues", queue)

        for priority in example("priority-classes.yaml"):
            name = priority["metadata"]["name"]
            self.priorities[name] = priority["metadata"]["name"] = self.unique(name)
            self.create_cluster_scoped("workloadpriorityclasses", priority)

        (local,) = example("local-queue.yaml")
        local["metadata"]["namespace"], local["spec"]["clusterQueue"] = self.namespace, self.cluster_queue
        self.local_queue = local["metadata"]["name"]
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "localqueues", local)

    def cleanup(self) -> None:
        delete_cluster_scoped(self.custom, self.created)


@pytest.fixture
def examples(kueue, kube, namespace) -> Iterator[ExampleQueues]:
    made = ExampleQueues(kube, namespace)
    try:
        made.apply()
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def operator(operator_factory):
    return operator_factory(extra_args=["--kueue"])


def active(examples: ExampleQueues) -> dict[str, Any]:
    return wait_for(lambda: examples.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues",
                                                                      examples.cluster_queue),
                    30, f"ClusterQueue {examples.cluster_queue} Active",
                    until=lambda q: conditions(q).get("Active", {}).get("status") == "True")


def the_example_jobs_labels() -> dict[str, str]:
    (job,) = example("elasticjob.yaml")
    return job["metadata"]["labels"]


def test_a_job_in_the_example_local_queue_is_admitted_by_the_example_cluster_queue_and_runs(
        api, namespace, operator, examples: ExampleQueues):
    active(examples)
    (template,) = example("resource-flavor.yaml")
    manifest = job_manifest("queued", SLEEP, minReplicas=1, maxReplicas=2, replicas=2, resources=WORKER)
    assert the_example_jobs_labels()["kueue.x-k8s.io/queue-name"] == examples.local_queue
    create(api, namespace, queued(manifest, queue=examples.local_queue, priority=examples.priorities["training-low"]))

    status = wait_for(lambda: status_of(api, namespace, "queued"), 90, "queued admitted by Kueue and Running",
                      until=lambda s: s.get("phase") == "Running"
                      and (s.get("admission") or {}).get("state") == "Admitted")
    admission = status["admission"]
    assert admission["clusterQueue"] == examples.cluster_queue and admission["workers"] == 2, admission
    assert set(admission["flavors"].values()) == {examples.flavor}, admission
    workload = examples.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "workloads",
                                                            admission["workload"])
    assert workload["spec"]["queueName"] == examples.local_queue
    low = {doc["metadata"]["name"]: doc["value"] for doc in example("priority-classes.yaml")}["training-low"]
    assert workload["spec"]["priority"] == low

    # The flavor's placement on every pod of the job: the node it names, and the GPU pool's toleration.
    running = wait_for(lambda: pods(api, namespace) + pods(api, namespace, "rendezvous"), 60,
                       "the admitted pods running on the flavor's node",
                       until=lambda ps: len(ps) == 3 and all(p.status.phase == "Running" for p in ps))
    (toleration,) = template["spec"]["tolerations"]
    for pod in running:
        assert (pod.spec.node_selector or {}).get("kubernetes.io/hostname") == NODE, pod.spec.node_selector
        assert pod.spec.node_name == NODE
        assert any((t.key, t.operator, t.effect) == (toleration["key"], toleration["operator"], toleration["effect"])
                   for t in pod.spec.tolerations or []), pod.spec.tolerations
