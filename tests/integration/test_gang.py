"""The workers' gang through the real API server and schedulers: the PodGroup of either API at minReplicas,
owned by the job; workers join it and bind; the store stays outside; a new minReplicas makes a new group.

Cheap sleeping workers: this is about the objects and the schedulers. Capacity scenarios with training are in
tests/e2e/test_gang_training.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jobapi import GROUP, PLURAL, VERSION, create, get_job, job_manifest, pods, wait_phase, wait_pods
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
APIS = {"Workload": ("scheduling.k8s.io", "v1alpha2"), "Coscheduling": ("scheduling.x-k8s.io", "v1alpha1")}


@pytest.fixture(scope="module")
def scheduler_plugins(cluster) -> None:
    if cluster.kind != "local":
        pytest.skip("the scheduler-plugins add-on runs on the local cluster")
    from localcluster import controlplane

    controlplane.ensure_up(ROOT, cluster.nodes or 0, addons=["scheduler-plugins"])


def pod_group(kube, namespace: str, mode: str, name: str = "train-workers") -> dict:
    group, version = APIS[mode]
    return client.CustomObjectsApi(kube).get_namespaced_custom_object(group, version, namespace, "podgroups", name)


def minimum(body: dict) -> int:
    spec = body["spec"]
    return spec["minMember"] if "minMember" in spec else spec["schedulingPolicy"]["gang"]["minCount"]


@pytest.fixture(params=["Workload", "Coscheduling"])
def mode(request) -> str:
    if request.param == "Coscheduling":
        request.getfixturevalue("scheduler_plugins")
    elif request.getfixturevalue("cluster").kind != "local":
        pytest.skip("the Workload API needs the local cluster's feature gates")
    return request.param


def test_workers_join_the_gang_at_min_replicas_and_the_store_stays_out(api, kube, namespace, operator, mode):
    create(api, namespace, job_manifest("train", minReplicas=2, maxReplicas=3, replicas=3,
                                        scheduling={"gang": mode}))
    workers = wait_pods(api, namespace, 3, timeout=90)
    group = pod_group(kube, namespace, mode)
    job = get_job(api, namespace, "train")
    assert minimum(group) == 2
    assert group["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert group["metadata"]["labels"] == {"elasticjob.dev/job-name": "train"}
    core = api[1]
    for pod in workers:
        raw = core.read_namespaced_pod(pod.metadata.name, namespace, _preload_content=False)
        spec, labels = _json(raw)["spec"], pod.metadata.labels
        if mode == "Workload":
            assert spec["schedulingGroup"] == {"podGroupName": "train-workers"}, spec
        else:
            assert labels["scheduling.x-k8s.io/pod-group"] == "train-workers"
            assert spec["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod.spec.node_name
    (store,) = pods(api, namespace, "rendezvous")
    raw_store = _json(core.read_namespaced_pod("train-rdzv", namespace, _preload_content=False))
    assert "schedulingGroup" not in raw_store["spec"]
    assert "scheduling.x-k8s.io/pod-group" not in store.metadata.labels
    assert raw_store["spec"].get("schedulerName") == (
        "scheduler-plugins-scheduler" if mode == "Coscheduling" else "default-scheduler")
    wait_phase(api, namespace, "train", "Running")

    # A new minReplicas. Coscheduling's minMember changes in place; the Workload API's group is protected while
    # pods refer to it (finalizer scheduling.k8s.io/podgroup-protection): it is made again when the workers
    # start anew (here: suspend, resume).
    custom = api[0]
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train", {"spec": {"minReplicas": 3}})
    if mode == "Coscheduling":
        updated = wait_for(lambda: pod_group(kube, namespace, mode), 60, "minMember 3",
                           until=lambda g: minimum(g) == 3)
        assert updated["metadata"]["uid"] == group["metadata"]["uid"]
        reasons = {"CreatedPodGroup", "UpdatedPodGroup"}
    else:
        wait_for(lambda: get_job(api, namespace, "train")["status"], 30, "the new generation observed",
                 until=lambda s: s.get("observedGeneration") == get_job(api, namespace, "train")["metadata"]["generation"])
        assert minimum(pod_group(kube, namespace, mode)) == 2
        assert [p.metadata.uid for p in pods(api, namespace)] == [p.metadata.uid for p in workers]
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train",
                                              {"spec": {"runPolicy": {"suspend": True}}})
        wait_phase(api, namespace, "train", "Suspended")
        wait_for(lambda: core.list_namespaced_pod(namespace).items, 60, "every pod gone", until=lambda ps: not ps)
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train",
                                              {"spec": {"runPolicy": {"suspend": False}}})
        again = wait_for(lambda: pod_group(kube, namespace, mode), 60, "the PodGroup made again with minimum 3",
                         until=lambda g: minimum(g) == 3, ignore=(ApiException,))
        assert again["metadata"]["uid"] != group["metadata"]["uid"]
        wait_pods(api, namespace, 3, timeout=90)
        reasons = {"CreatedPodGroup", "RecreatingPodGroup"}
    events = wait_for(lambda: core.list_namespaced_event(namespace).items, 30, f"events {sorted(reasons)}",
                      until=lambda evs: reasons <= {e.reason for e in evs})
    assert all(sum(e.reason == r for e in events) == (2 if r == "CreatedPodGroup" and mode == "Workload" else 1)
               for r in reasons), [(e.reason, e.message) for e in events]


def test_a_replacement_worker_joins_the_gang_and_binds_alone(api, kube, namespace, operator, mode):
    create(api, namespace, job_manifest("train", minReplicas=2, maxReplicas=2, replicas=2,
                                        scheduling={"gang": mode}))
    before = wait_pods(api, namespace, 2, timeout=90)
    api[1].delete_namespaced_pod("train-worker-1", namespace, grace_period_seconds=0)
    after = wait_for(lambda: pods(api, namespace), 60, "a replacement train-worker-1 bound",
                     until=lambda ps: len(ps) == 2 and ps[1].metadata.uid != before[1].metadata.uid
                     and ps[1].spec.node_name)
    assert after[0].metadata.uid == before[0].metadata.uid


def _json(response) -> dict:
    import json

    return json.loads(response.data)
