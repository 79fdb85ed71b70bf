"""The local control plane is a real one: the release asked for (the pinned one by default), RBAC, ServiceAccount
tokens, the controller-manager's controllers (ReplicaSets, garbage collector, namespaces, node lifecycle) and the
scheduler all work.

Nodes here are bare Node objects this test creates (no kubelet), so the tests need no node agent; pods of
the Deployment test are pinned to a label no node has, so a node agent that is running never sees them.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helpers import wait_for

# Never beside other tests (make test runs these after the tier's parallel part):
# it adds a node of its own and silences it.
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]

NO_NODE = {"elasticjob.dev/test-node": "none"}
TEST_NODE_LABEL = "elasticjob.dev/test-node"


def _status_of(call) -> int | None:
    try:
        call()
    except ApiException as err:
        return err.status
    return None


def _gone(read) -> bool:
    return _status_of(read) == 404


def _impersonating(cluster, user: str) -> client.ApiClient:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    return api


def test_server_is_the_release_asked_for(cluster, kube):
    """v1.36.3, the release go.mod pins; K8S_VERSION (ELASTICJOB_K8S_VERSION) may ask for another."""
    if cluster.kind != "local":
        pytest.skip("the release is a property of the local cluster")
    from localcluster import components, controlplane

    asked = components.release(controlplane.bin_dir(ROOT))
    assert client.VersionApi(kube).get_code().git_version == asked
    if not os.environ.get("ELASTICJOB_K8S_VERSION"):
        assert asked == "v1.36.3"


def test_rbac_denies_an_unprivileged_service_account_listing_secrets(cluster, kube, namespace):
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="plain")))
    user = f"system:serviceaccount:{namespace}:plain"
    as_plain = _impersonating(cluster, user)
    try:
        plain_core = client.CoreV1Api(as_plain)
        assert _status_of(lambda: plain_core.list_namespaced_secret(namespace)) == 403

        # The same identity is allowed once a RoleBinding grants it, so the 403 above was RBAC's doing.
        rbac.create_namespaced_role(namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name="read-secrets"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["list"])]))
        rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="read-secrets"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-secrets"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="plain", namespace=namespace)]))
        wait_for(lambda: _status_of(lambda: plain_core.list_namespaced_secret(namespace)), 30,
                 "the RoleBinding to allow listing secrets", until=lambda status: status is None)
        assert _status_of(lambda: plain_core.list_namespaced_secret("kube-system")) == 403
    finally:
        as_plain.close()


def test_service_account_tokens_are_issued_and_accepted(kube, namespace):
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="bot")))
    token = core.create_namespaced_service_account_token("bot", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token

    bearer = client.Configuration()
    bearer.host = kube.configuration.host
    bearer.ssl_ca_cert = kube.configuration.ssl_ca_cert
    bearer.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(bearer) as as_bot:
        review = client.AuthenticationV1Api(as_bot).create_self_subject_review(client.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:bot"
        assert _status_of(lambda: client.CoreV1Api(as_bot).list_namespaced_secret(namespace)) == 403


def test_deployment_gets_a_replicaset_and_pods(kube, namespace):
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(namespace, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(node_selector=NO_NODE, containers=[
                    client.V1Container(name="web", image="pause:test")])))))

    replica_sets = wait_for(lambda: apps.list_namespaced_replica_set(namespace).items, 30,
                            "the Deployment's ReplicaSet", until=lambda items: len(items) == 1)
    owner = replica_sets[0].metadata.owner_references[0]
    assert (owner.kind, owner.name) == ("Deployment", "web")

    pods = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector="app=web").items, 30,
                    "2 pods of the ReplicaSet", until=lambda items: len(items) == 2)
    assert {p.metadata.owner_references[0].name for p in pods} == {replica_sets[0].metadata.name}


@pytest.mark.parametrize("propagation", ["Background", "Foreground"])
def test_garbage_collector_deletes_dependents_of_a_deleted_owner(kube, namespace, propagation):
    core = client.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(
        name="dependent",
        owner_references=[client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)])))

    core.delete_namespaced_config_map("owner", namespace, propagation_policy=propagation)

    wait_for(lambda: _gone(lambda: core.read_namespaced_config_map("dependent", namespace)), 60,
             f"the garbage collector to delete the dependent ConfigMap ({propagation})")
    wait_for(lambda: _gone(lambda: core.read_namespaced_config_map("owner", namespace)), 30,
             "the owner ConfigMap to be gone")


def test_namespace_deletion_completes(kube):
    core = client.CoreV1Api(kube)
    name = f"t-ns-deletion-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="content")))

    core.delete_namespace(name)

    wait_for(lambda: _gone(lambda: core.read_namespace(name)), 90,
             f"the namespace controller to finish deleting {name}")


# ---------------------------------------------------------------- nodes without a kubelet


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.fixture
def bare_node(kube) -> Iterator[str]:
    """A Node object reporting Ready once and then never again, as a node whose kubelet died would."""
    core = client.CoreV1Api(kube)
    name = f"t-bare-{secrets.token_hex(3)}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={TEST_NODE_LABEL: name})))
    try:
        now = _now().isoformat()
        resources = {"cpu": "4", "memory": "8Gi", "pods": "10"}
        core.patch_node_status(name, {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
        yield name
    finally:
        core.delete_node(name)


def _ready_status(node: client.V1Node) -> str | None:
    return next((c.status for c in node.status.conditions or [] if c.type == "Ready"), None)


def test_scheduler_binds_a_pod_to_a_ready_node(kube, namespace, bare_node):
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="placed"),
        spec=client.V1PodSpec(node_selector={TEST_NODE_LABEL: bare_node}, containers=[
            client.V1Container(name="c", image="pause:test")])))
    try:
        pod = wait_for(lambda: core.read_namespaced_pod("placed", namespace), 30,
                       f"the scheduler to bind the pod to {bare_node}", until=lambda p: p.spec.node_name)
        assert pod.spec.node_name == bare_node
    finally:
        # No kubelet will confirm a graceful deletion.
        core.delete_namespaced_pod("placed", namespace, grace_period_seconds=0)


def test_node_lifecycle_controller_notices_a_silent_node(kube, bare_node):
    core = client.CoreV1Api(kube)
    wait_for(lambda: core.read_node(bare_node), 90, f"node {bare_node} to go Ready=Unknown",
             until=lambda node: _ready_status(node) == "Unknown")
    # NoSchedule only: when every node of a zone is down the controller assumes it lost its own connectivity
    # and holds the NoExecute (eviction) taint back; with other Ready nodes a lost node gets NoExecute too.
    wait_for(lambda: {(t.key, t.effect) for t in core.read_node(bare_node).spec.taints or []}, 30,
             "the unreachable taint", until=lambda taints: ("node.kubernetes.io/unreachable", "NoSchedule") in taints)
