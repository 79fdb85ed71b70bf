"""Gang scheduling, Kueue admission and in-cluster API access on the local cluster, with the real components.

- The default kube-scheduler's gang plugin (scheduling.k8s.io/v1alpha2 PodGroup, `gang.minCount`, pods joining
  through `spec.schedulingGroup.podGroupName`) and scheduler-plugins' Coscheduling (scheduling.x-k8s.io/v1alpha1
  PodGroup, `minMember`, the `scheduling.x-k8s.io/pod-group` label): three pods in a group of minimum three, on
  nodes with room for two of them, are none bound; once a blocker pod goes, all three bind.
- Kueue admits a Workload within its ClusterQueue's quota and keeps a second one pending beyond it.
- A pod reaches the API server through the `kubernetes` Service with its projected ServiceAccount token (in-cluster
  config): allowed with a RoleBinding, 403 without.

The add-ons start on first use (`controlplane.ensure_up(..., addons=[...])`); their binaries are built then if
missing (minutes, once). Each test makes its own namespace; cluster-scoped objects it makes are deleted after it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from jobapi import one_per_node_cpu, pod_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers import wait_for

# Never beside other tests (make test runs these after the tier's parallel part):
# it fills all nodes but two with blocker pods and adds kwok's nodes.
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]
SLEEP = ["sleep", "3600"]
GANG = 3
# How long the pods of an incomplete gang are watched staying unbound, once the scheduler has tried them.
HOLD_SECONDS = 3


def _local_only(cluster) -> None:
    if cluster.kind != "local":
        pytest.skip("sized to, or started on, the local cluster")


def _addon(cluster, name: str) -> None:
    from localcluster import controlplane

    _local_only(cluster)
    controlplane.ensure_up(ROOT, cluster.nodes or 0, addons=[name])


@pytest.fixture(scope="module")
def scheduler_plugins(cluster) -> str:
    _addon(cluster, "scheduler-plugins")
    from localcluster.schedplugins_addon import SCHEDULER_NAME

    return SCHEDULER_NAME


@pytest.fixture(scope="module")
def kueue(cluster):
    _addon(cluster, "kueue")
    from localcluster import kueue_addon

    return kueue_addon


# ---------------------------------------------------------------- gangs


def _pod(name: str, cpu: str, **spec) -> dict:
    labels = spec.pop("labels", {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": pod_spec([{"name": "c", "command": SLEEP, "resources": {"requests": {"cpu": cpu}}}],
                             terminationGracePeriodSeconds=1, **spec)}


def _block_all_but_two_nodes(core: client.CoreV1Api, namespace: str) -> tuple[str, list[str]]:
    """Pods asking for just over half the freest node's CPU fit one per node, whatever the nodes' sizes; blockers
    take all nodes but two. Returns that request and the blockers' names, once they run."""
    count, big = one_per_node_cpu(core)
    assert count >= GANG, f"needs {GANG} schedulable nodes, the cluster has {count}"
    blockers = [f"blocker-{i}" for i in range(count - (GANG - 1))]
    for name in blockers:
        core.create_namespaced_pod(namespace, _pod(name, big))
    for name in blockers:
        wait_for(lambda: core.read_namespaced_pod(name, namespace).spec.node_name, 60, f"{name} to be bound")
    return big, blockers


def _bound(core: client.CoreV1Api, namespace: str, names: list[str]) -> dict[str, str | None]:
    return {name: core.read_namespaced_pod(name, namespace).spec.node_name for name in names}


def _tried(core: client.CoreV1Api, namespace: str, names: list[str]) -> list[str]:
    """Pods the scheduler found unschedulable (PodScheduled=False): it has run on the group."""
    tried = []
    for name in names:
        conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
        if any(c.type == "PodScheduled" and c.status == "False" for c in conditions):
            tried.append(name)
    return tried


def _assert_gang_waits_then_binds(core: client.CoreV1Api, namespace: str, members: list[str],
                                  blockers: list[str]) -> None:
    wait_for(lambda: _tried(core, namespace, members), 60, "the scheduler to find a gang member unschedulable")
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        bound = {name: node for name, node in _bound(core, namespace, members).items() if node}
        assert not bound, f"gang members bound although only {GANG - 1} fit: {bound}"
        time.sleep(0.2)
    for name in blockers:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    nodes = wait_for(lambda: _bound(core, namespace, members), 90, "all gang members to bind once room appears",
                     until=lambda seen: all(seen.values()))
    assert len(set(nodes.values())) == GANG, f"one member per node expected: {nodes}"


def test_upstream_gang_binds_all_or_none(cluster, kube, namespace):
    _local_only(cluster)
    core = client.CoreV1Api(kube)
    big, blockers = _block_all_but_two_nodes(core, namespace)
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", namespace, "podgroups",
        {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": {"name": "gang"},
         "spec": {"schedulingPolicy": {"gang": {"minCount": GANG}}}})
    members = [f"member-{i}" for i in range(GANG)]
    for name in members:
        core.create_namespaced_pod(namespace, _pod(name, big, schedulingGroup={"podGroupName": "gang"}))
    # An apiserver without the GenericWorkload gate drops the field silently (and the pods schedule one by one).
    stored = json.loads(core.read_namespaced_pod(members[0], namespace, _preload_content=False).data)
    assert stored["spec"].get("schedulingGroup") == {"podGroupName": "gang"}, stored["spec"]
    _assert_gang_waits_then_binds(core, namespace, members, blockers)


def test_coscheduling_gang_binds_all_or_none(cluster, kube, namespace, scheduler_plugins):
    core = client.CoreV1Api(kube)
    big, blockers = _block_all_but_two_nodes(core, namespace)
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "gang"},
         "spec": {"minMember": GANG}})
    members = [f"member-{i}" for i in range(GANG)]
    for name in members:
        core.create_namespaced_pod(namespace, _pod(name, big, schedulerName=scheduler_plugins,
                                                   labels={"scheduling.x-k8s.io/pod-group": "gang"}))
    _assert_gang_waits_then_binds(core, namespace, members, blockers)


# ---------------------------------------------------------------- Kueue


def _workload(name: str, queue: str, cpu: str) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": name},
            "spec": {"queueName": queue, "podSets": [{
                "name": "main", "count": 1,
                "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": "100Mi"}}}]}}}]}}


def _conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def test_kueue_admits_within_quota_and_queues_beyond_it(kube, namespace, kueue):
    custom = client.CustomObjectsApi(kube)
    queue = f"cq-{namespace}"
    kueue.ensure_cluster_queue(kube, queue, cpu="1", memory="1Gi", namespaces=[namespace])
    try:
        kueue.ensure_local_queue(kube, namespace, "lq", queue)

        def read(name: str) -> dict:
            return custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads", name)

        custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads",
                                               _workload("first", "lq", "1"))
        admitted = wait_for(lambda: read("first"), 60, "the first workload to be admitted",
                            until=lambda wl: _conditions(wl).get("Admitted", {}).get("status") == "True")
        assert _conditions(admitted)["QuotaReserved"]["status"] == "True"
        admission = admitted["status"]["admission"]
        assert admission["clusterQueue"] == queue
        (assignment,) = admission["podSetAssignments"]
        assert assignment["name"] == "main" and assignment["count"] == 1
        assert assignment["flavors"] == {"cpu": kueue.FLAVOR, "memory": kueue.FLAVOR}
        assert assignment["resourceUsage"]["cpu"] == "1"

        custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads",
                                               _workload("second", "lq", "1"))
        pending = wait_for(lambda: read("second"), 60, "the second workload to be found short of quota",
                           until=lambda wl: _conditions(wl).get("QuotaReserved", {}).get("status") == "False")
        assert "insufficient unused quota for cpu" in _conditions(pending)["QuotaReserved"]["message"]
        assert _conditions(pending).get("Admitted", {}).get("status", "False") == "False"
        assert "admission" not in pending["status"]

        # More quota: the queued one is admitted without being touched.
        kueue.set_cluster_queue_quota(kube, cpu="2", memory="1Gi", name=queue)
        wait_for(lambda: read("second"), 60, "the second workload to be admitted once the quota grows",
                 until=lambda wl: _conditions(wl).get("Admitted", {}).get("status") == "True")
    finally:
        try:
            custom.delete_collection_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")
            custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", queue)
        except ApiException as err:
            if err.status != 404:
                raise


# ---------------------------------------------------------------- in-cluster config

IN_CLUSTER = (
    "from kubernetes import client, config; config.load_incluster_config(); "
    "print('pods:', len(client.CoreV1Api().list_namespaced_pod('{namespace}').items))"
)


def _run_in_cluster_client(core: client.CoreV1Api, namespace: str, account: str) -> tuple[str, str]:
    """Runs the in-cluster client as `account`; returns (phase, log) once the pod has finished."""
    name = f"client-{account}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": pod_spec([{"name": "c", "command": ["python", "-c", IN_CLUSTER.format(namespace=namespace)]}],
                         operator_image=True,
                         serviceAccountName=account, restartPolicy="Never", terminationGracePeriodSeconds=1)})
    pod = wait_for(lambda: core.read_namespaced_pod(name, namespace), 90, f"pod {name} to finish",
                   until=lambda p: p.status.phase in ("Succeeded", "Failed"))
    return pod.status.phase, core.read_namespaced_pod_log(name, namespace)


def test_a_pod_reaches_the_api_server_with_in_cluster_config(cluster, kube, namespace):
    _local_only(cluster)
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "list-pods"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "list-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})

    phase, log = _run_in_cluster_client(core, namespace, "reader")
    assert phase == "Succeeded", f"the in-cluster client failed:\n{log}"
    assert "pods: 1" in log, log  # itself

    phase, log = _run_in_cluster_client(core, namespace, "nobody")
    assert phase == "Failed", f"listing pods without RBAC succeeded:\n{log}"
    assert "(403)" in log and "Forbidden" in log, log


# ---------------------------------------------------------------- kwok (fleet benchmarks)


def test_kwok_nodes_run_pods_without_processes_and_leave_with_the_addon(cluster, kube, namespace):
    """`up --kwok`: pods placed on its fake nodes are Running at once, with no process behind them; stopping
    the add-on removes its nodes, so the tests after this one see only the real ones."""
    from localcluster import controlplane, kwok_addon

    _addon(cluster, "kwok")
    core = client.CoreV1Api(kube)
    selector = f"{kwok_addon.LABEL[0]}={kwok_addon.LABEL[1]}"
    try:
        assert len(core.list_node(label_selector=selector).items) == kwok_addon.FAKE_NODES
        # 100 cpu: more than any real node has. Held back by a gate until its creation is a second old, so that
        # a start time taken when kwok plays its stage would differ from the creation time (both whole seconds).
        pod = _pod("fake", "100", schedulingGates=[{"name": "elasticjob.dev/test"}], **kwok_addon.POD_PLACEMENT)
        created = core.create_namespaced_pod(namespace, pod).metadata.creation_timestamp
        wait_for(lambda: datetime.now(UTC) >= created + timedelta(seconds=1.5), 10, "a second on the clock")
        core.patch_namespaced_pod("fake", namespace, {"spec": {"schedulingGates": None}})
        running = wait_for(lambda: core.read_namespaced_pod("fake", namespace), 60, "the kwok pod Running",
                           until=lambda p: p.status.phase == "Running")
        assert running.spec.node_name.startswith(kwok_addon.NODE_PREFIX)
        # From the pod alone, so that a stage played twice writes nothing the second time: its address from its
        # uid (kwok's pool gave each play a new one), its times its creation (not each play's moment).
        assert running.status.pod_ip == kwok_addon.fake_pod_ip(running.metadata.uid)
        assert running.status.start_time == running.metadata.creation_timestamp
    finally:
        controlplane.stop_addon(ROOT, "kwok", log=lambda line: None)
    assert core.list_node(label_selector=selector).items == []
