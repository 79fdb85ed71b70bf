"""Gang scheduling at minReplicas with real training (issue 10), on the local cluster.

Each worker asks for just over half a node's cpu, so one fits per node; blocker pods (bound to a node by name)
leave room for fewer workers than minReplicas. Then no worker is bound: nothing sits half-started. When a
second node frees up, minReplicas workers are bound together and train; the third worker, above the minimum,
binds on its own when the last node frees up, and joins the training.
The Workload API runs in `make test`; scheduler-plugins' Coscheduling in `make e2e`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client

from e2e_support import PULL_SECRETS, WORKER_IMAGE, job_manifest, train_args
from helpers import wait_for
from test_training import finish, wait_progress

ROOT = Path(__file__).resolve().parents[2]
HOLD_SECONDS = 4  # unbound workers are watched this long once the scheduler has found them unschedulable
START_TIMEOUT = 120


@pytest.fixture(params=["Workload", pytest.param("Coscheduling", marks=pytest.mark.slow)])
def gang(request, cluster) -> str:
    if cluster.kind != "local":
        pytest.skip("sized to the local cluster's nodes")
    if request.param == "Coscheduling":
        from localcluster import controlplane

        controlplane.ensure_up(ROOT, cluster.nodes or 0, addons=["scheduler-plugins"])
    return request.param


def millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(quantity) * 1000


def nodes(core: client.CoreV1Api) -> list[tuple[str, int]]:
    """(name, allocatable millicores) of the schedulable nodes."""
    found = [(n.metadata.name, millicores(n.status.allocatable["cpu"])) for n in core.list_node().items
             if not n.spec.unschedulable]
    return sorted(found)


def free(core: client.CoreV1Api, node: str) -> int:
    """Millicores of the node that its pods do not request (the kubelet's admission rule)."""
    allocatable = millicores(core.read_node(node).status.allocatable["cpu"])
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    asked = sum(millicores((c.resources.requests or {}).get("cpu", "0m") if c.resources else "0m")
                for p in pods if p.status.phase not in ("Succeeded", "Failed") for c in p.spec.containers)
    return allocatable - asked


def leaving(core: client.CoreV1Api, nodes: tuple[str, ...]) -> list[str]:
    """Pods on the nodes that are going: deleted, or in a namespace being deleted. An earlier test's namespace is
    deleted at its end, but its pods get their own deletion a few seconds later, from the namespace controller:
    sized while they still held CPU, a blocker left room for a worker once they went (a CI failure)."""
    going = {ns.metadata.name for ns in core.list_namespace().items
             if ns.metadata.deletion_timestamp or (ns.status and ns.status.phase == "Terminating")}
    return [f"{p.metadata.namespace}/{p.metadata.name}" for node in nodes
            for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
            if p.metadata.deletion_timestamp or p.metadata.namespace in going]


def blocker(name: str, node: str, cpu: str) -> dict:
    # The worker image: the local registry has it (and it is the one a real node may have pulled already).
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "imagePullSecrets": PULL_SECRETS,
                     "containers": [
                {"name": "c", "image": WORKER_IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"],
                 "resources": {"requests": {"cpu": cpu}}}]}}


def bound(core: client.CoreV1Api, namespace: str) -> dict[str, str | None]:
    selector = "elasticjob.dev/job-name=train,elasticjob.dev/role=worker"
    return {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if not p.metadata.deletion_timestamp}


def scheduled_at(core: client.CoreV1Api, namespace: str, name: str) -> float:
    pod = core.read_namespaced_pod(name, namespace)
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled" and c.status == "True")
    return cond.last_transition_time.timestamp()


def unschedulable(core: client.CoreV1Api, namespace: str) -> list[str]:
    selector = "elasticjob.dev/job-name=train,elasticjob.dev/role=worker"
    return [p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or [])]


def test_min_replicas_start_together_and_extras_one_by_one(gang, operator, jobs, progress):
    core = jobs.core
    (n0, cpu), (n1, _), (n2, _) = nodes(core)[:3]
    # Over half a node: one worker per node (8 cpus on process-backed nodes, this machine's 2 on real ones);
    # the rest leaves room for the store (100m) and CoreDNS.
    big = f"{cpu // 2 + 1}m"
    # The pods of the test before may still be leaving: sized while they hold CPU, a blocker would free it later.
    wait_for(lambda: leaving(core, (n0, n1, n2)), 120, "the pods of earlier tests gone from the nodes",
             until=lambda names: not names)
    for name, node in (("block-0", n0), ("block-1", n1)):
        # Each blocked node keeps 1m less than a worker: sized to what the node's pods already ask (the operator's
        # replicas, CoreDNS, an add-on's controller), since the kubelet refuses a bound pod that does not fit.
        core.create_namespaced_pod(jobs.namespace, blocker(name, node, f"{max(1, free(core, node) - millicores(big) + 1)}m"))
    for name in ("block-0", "block-1"):
        wait_for(lambda: jobs.pod(name).status.phase, 60, f"{name} running", until=lambda p: p == "Running")
    steps = 40
    manifest = job_manifest(jobs.namespace, train_args=train_args(steps, checkpoint_every=5), min_replicas=2,
                            max_replicas=3, replicas=3, scheduling={"gang": gang})
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": big}}
    jobs.create(manifest)

    # Room for one worker, two needed: the scheduler tries, and binds none.
    wait_for(lambda: unschedulable(core, jobs.namespace), 60, "the scheduler to find a worker unschedulable")
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        placed = {name: node for name, node in bound(core, jobs.namespace).items() if node}
        assert not placed, f"workers bound with room for only one of minReplicas=2: {placed}"
        time.sleep(0.2)
    assert jobs.status()["phase"] == "Pending" and not progress().records

    # A second node frees up: minReplicas workers are bound together and train at world size 2.
    core.delete_namespaced_pod("block-0", jobs.namespace, grace_period_seconds=0)
    pair = wait_for(lambda: bound(core, jobs.namespace), 60, "two workers bound",
                    until=lambda seen: sum(1 for node in seen.values() if node) == 2)
    placed = sorted(name for name, node in pair.items() if node)
    times = [scheduled_at(core, jobs.namespace, name) for name in placed]
    assert max(times) - min(times) <= 2, f"gang members bound {max(times) - min(times):.1f}s apart: {placed}"
    assert len({pair[name] for name in placed}) == 2
    wait_progress(progress, lambda p: 2 in p.world_sizes(), START_TIMEOUT, "training at world size 2")
    assert sum(1 for node in bound(core, jobs.namespace).values() if node) == 2

    # The last node frees up: the third worker (above the minimum) binds alone and joins.
    core.delete_namespaced_pod("block-1", jobs.namespace, grace_period_seconds=0)
    wait_for(lambda: bound(core, jobs.namespace), 60, "the third worker bound",
             until=lambda seen: all(seen.values()) and len(seen) == 3)
    wait_progress(progress, lambda p: 3 in p.world_sizes(), START_TIMEOUT, "training at world size 3")
    done = finish(jobs, progress, steps)
    assert jobs.status()["restarts"] == 0, jobs.status()
    assert {2, 3} <= done.world_sizes()
