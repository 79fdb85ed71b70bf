"""The chart's RBAC on a real API server: render it with Helm, install it, and act as its ServiceAccount.

Shared by tests/integration/test_rbac.py and the e2e scenario that trains under that ServiceAccount.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "elasticjob-operator"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
CLUSTER_KINDS = ("ClusterRole", "ClusterRoleBinding")


def render(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def install_rbac(kube) -> Iterator[Callable[[dict[str, Any], str], str]]:
    """Applies the chart's ServiceAccount and RBAC objects; returns the account's user name.

    Cluster-scoped objects are deleted afterwards; namespaced ones go with the test's namespace.
    """
    rbac = client.RbacAuthorizationV1Api(kube)
    created: list[tuple[str, str]] = []

    def install(values: dict[str, Any], namespace: str) -> str:
        release = f"rbac-{secrets.token_hex(3)}"
        docs = [d for d in render(values, release, namespace) if d["kind"] in RBAC_KINDS]
        assert {d["kind"] for d in docs} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
        for doc in docs:
            utils.create_from_dict(kube, doc)
            if doc["kind"] in CLUSTER_KINDS:
                created.append((doc["kind"], doc["metadata"]["name"]))
        (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
        return f"system:serviceaccount:{namespace}:{account['metadata']['name']}"

    yield install
    for kind, name in created:
        delete = rbac.delete_cluster_role if kind == "ClusterRole" else rbac.delete_cluster_role_binding
        try:
            delete(name)
        except ApiException as err:
            if err.status != 404:
                raise


def allowed(kube, user: str, verb: str, group: str, resource: str, subresource: str, namespace: str,
            name: str = "") -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user,
        groups=["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb, group=group, resource=resource, subresource=subresource or None,
            namespace=namespace or None, name=name or None),
    ))
    return client.AuthorizationV1Api(kube).create_subject_access_review(review).status.allowed


def service_account_kubeconfig(kube, admin_kubeconfig: Path, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount with a short-lived token (TokenRequest API)."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=[], expiration_seconds=3600))
    token = client.CoreV1Api(kube).create_namespaced_service_account_token(account, namespace, request).status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = dict(next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"])
    if "certificate-authority" in cluster:  # relative paths would resolve against the new file's directory
        cluster["certificate-authority"] = str((admin_kubeconfig.parent / cluster["certificate-authority"]).resolve())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "cluster", "user": account, "namespace": namespace}}],
    }))
    return path
