"""A node's taint (--taint-bad-nodes) written and removed against a real API server: its merge patch beside the
taints Kubernetes writes itself, the resourceVersion precondition, the label the sweep lists by, and the 403 an
operator without the chart's badNodes.taint grant gets. The node is a Node object alone (no kubelet), made
unschedulable so that nothing lands on it meanwhile."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from chart_rbac import allowed, service_account_kubeconfig
from elasticjob import k8s, planner
from elasticjob.controller import node_taints
from elasticjob.naming import UNHEALTHY_TAINT as KEY
from elasticjob.naming import UNHEALTHY_UNTIL_ANNOTATION as UNTIL
from helpers import wait_for

# Never beside other tests (make test runs these after the tier's parallel part):
# it taints the cluster's nodes.
pytestmark = pytest.mark.alone

OTHER = {"key": "example.com/maintenance", "value": "soon", "effect": "PreferNoSchedule"}


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def node(kube) -> Iterator[str]:
    core = client.CoreV1Api(kube)
    name = f"taint-test-{secrets.token_hex(3)}"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                      "spec": {"unschedulable": True, "taints": [OTHER]}})
    yield name
    try:
        core.delete_node(name)
    except ApiException as err:
        if err.status != 404:
            raise


def read(kube, name: str) -> dict:
    return client.CoreV1Api(kube).api_client.sanitize_for_serialization(client.CoreV1Api(kube).read_node(name))


def ours(node: dict) -> list[dict]:
    return [t for t in node["spec"].get("taints") or [] if t["key"] == KEY]


def kept(node: dict) -> list[dict]:
    """The taints neither ours nor Kubernetes' own (the API server adds node.kubernetes.io/not-ready to a new node,
    and a node lifecycle controller more to one whose kubelet never reports)."""
    return [t for t in node["spec"].get("taints") or [] if t["key"] != KEY
            and not t["key"].startswith("node.kubernetes.io/")]


def test_a_node_is_tainted_then_untainted_beside_the_taints_of_others(kube, node):
    ours_kube = k8s.Kube(kube)
    others = kept(read(kube, node))
    assert others == [OTHER]
    now = datetime.now(UTC)
    until = stamp(now + timedelta(seconds=600))
    assert asyncio.run(node_taints.taint(ours_kube, planner.TaintNode(node, "WorkerFailed", until)))
    stored = read(kube, node)
    assert ours(stored) == [{"key": KEY, "value": "WorkerFailed", "effect": "NoSchedule"}]
    assert kept(stored) == others
    assert stored["spec"]["unschedulable"] is True
    assert stored["metadata"]["annotations"][UNTIL] == until and stored["metadata"]["labels"][KEY] == "WorkerFailed"
    # An earlier end (another job's) changes nothing; a later one moves the end and the reason.
    assert not asyncio.run(node_taints.taint(ours_kube, planner.TaintNode(node, "Partitioned", stamp(now))))
    later = stamp(now + timedelta(seconds=900))
    assert asyncio.run(node_taints.taint(ours_kube, planner.TaintNode(node, "Partitioned", later)))
    assert [t["value"] for t in ours(read(kube, node))] == ["Partitioned"]
    # The sweep finds it by its label, and removes it only once its end is past.
    assert asyncio.run(node_taints.sweep(ours_kube, now + timedelta(seconds=600))) == []
    assert node in asyncio.run(node_taints.sweep(ours_kube, now + timedelta(seconds=900)))
    stored = read(kube, node)
    assert ours(stored) == [] and kept(stored) == others
    assert KEY not in (stored["metadata"].get("labels") or {})
    assert UNTIL not in (stored["metadata"].get("annotations") or {})


def test_a_stale_read_is_refused_by_the_api_server(kube, node):
    """The resourceVersion in the patch: a node changed since it was read is not overwritten."""
    from elasticjob import taints

    stale = read(kube, node)
    client.CoreV1Api(kube).patch_node(node, {"metadata": {"labels": {"example.com/touched": "yes"}}})
    patch = taints.taint_patch(stale, "WorkerFailed", stamp(datetime.now(UTC) + timedelta(seconds=60)))
    with pytest.raises(k8s.Conflict):
        asyncio.run(k8s.Kube(kube).patch_node(node, patch))


def test_without_the_grant_a_taint_is_forbidden_and_with_it_written(kube, cluster, namespace, install_rbac, node,
                                                                    tmp_path):
    def operator_kube(values: dict) -> k8s.Kube:
        user = install_rbac(values, namespace)
        wait_for(lambda: allowed(kube, user, "get", "", "nodes", "", ""), 30, f"{user} to be allowed to read nodes")
        path = service_account_kubeconfig(kube, Path(cluster.kubeconfig), namespace, user.rsplit(":", 1)[1],
                                          tmp_path / f"{user.rsplit(':', 1)[1]}.kubeconfig")
        return k8s.Kube(config.new_client_from_config(config_file=str(path)))

    action = planner.TaintNode(node, "NodeCheckFailed", stamp(datetime.now(UTC) + timedelta(seconds=600)))
    plain = operator_kube({})
    with pytest.raises(k8s.Forbidden):
        asyncio.run(node_taints.taint(plain, action))
    with pytest.raises(k8s.Forbidden):
        asyncio.run(node_taints.sweep(plain, datetime.now(UTC)))
    granted = operator_kube({"badNodes": {"taint": True}})
    assert asyncio.run(node_taints.taint(granted, action))
    assert asyncio.run(node_taints.sweep(granted, datetime.now(UTC) + timedelta(seconds=601))) == [node]
    assert ours(read(kube, node)) == []
