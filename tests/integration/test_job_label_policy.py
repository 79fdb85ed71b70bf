"""The chart's jobLabelPolicy through the real API server (no operator: the test acts as the operator's
ServiceAccount and as a tenant, by impersonation): only the operator may create a pod wearing the labels its
NetworkPolicies trust, or add, change or remove them on one; an update that keeps them passes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client, config

from helpers import api_refusal as attempt
from helpers import wait_for

JOB_LABEL, ROLE_LABEL = "elasticjob.dev/job-name", "elasticjob.dev/role"
TENANT = "tenant@example.com"
SUFFIX = "-job-labels-reserved"


@contextmanager
def label_policy(kube, namespace: str) -> Iterator[str]:
    """The chart's policy and binding, bound to this test's namespace only; yields the operator's user name (its
    ServiceAccount as the same render's Deployment runs it)."""
    import chart_rbac

    values = {"watch": {"allNamespaces": False, "namespaces": [namespace]}}
    docs = chart_rbac.render(values, f"l{namespace[-6:]}", namespace)
    policy, binding = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")
                       and d["metadata"]["name"].endswith(SUFFIX)]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    admissions = client.AdmissionregistrationV1Api(kube)
    admissions.create_validating_admission_policy(policy)
    try:
        admissions.create_validating_admission_policy_binding(binding)
        try:
            yield f"system:serviceaccount:{namespace}:{account}"
        finally:
            admissions.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    finally:
        admissions.delete_validating_admission_policy(policy["metadata"]["name"])


@pytest.fixture
def acting_as(cluster, kube, namespace) -> Iterator[Callable[[str], client.CoreV1Api]]:
    """Core clients that impersonate a user, each allowed to create, read and update pods in the namespace (the
    operator's ServiceAccount need not exist: a request names only its user)."""
    rbac = client.RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="pod-writer"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"],
                                   verbs=["create", "get", "update", "patch"])]))
    opened: list[client.ApiClient] = []

    def act(user: str) -> client.CoreV1Api:
        rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(generate_name="pod-writer-"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-writer"),
            subjects=[client.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="User", name=user)]))
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        opened.append(api)
        return client.CoreV1Api(api)

    yield act
    for api in opened:
        api.close()


def pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod no scheduler takes: it stays Pending, and nothing runs."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}}


def relabel(core: client.CoreV1Api, namespace: str, name: str, labels: dict[str, str | None]) -> Callable[[], object]:
    return lambda: core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": labels}})


def refused_for(exc: client.ApiException | None, label: str, operator: str) -> bool:
    return (exc is not None and exc.status == 403 and f"the pod label(s) {label} are reserved" in exc.body
            and f"only the elasticjob operator ({operator}) may set" in exc.body)


def test_only_the_operator_may_label_a_pod_as_a_jobs(kube, namespace, acting_as):
    with label_policy(kube, namespace) as operator_user:
        tenant, operator = acting_as(TENANT), acting_as(operator_user)
        worker = {JOB_LABEL: "train", ROLE_LABEL: "worker"}
        # Policies take effect once the API server has loaded them: retry until a forged pod is refused (a new name
        # each time: one let through before that is in the namespace now).
        tries = iter(range(10_000))
        wait_for(lambda: attempt(lambda: tenant.create_namespaced_pod(
            namespace, pod(f"forged-{next(tries)}", {JOB_LABEL: "train"}))), 30, "a tenant's labelled pod refused",
            until=lambda exc: refused_for(exc, JOB_LABEL, operator_user))
        assert refused_for(attempt(lambda: tenant.create_namespaced_pod(
            namespace, pod("forged-role", {ROLE_LABEL: "rendezvous"}))), ROLE_LABEL, operator_user)

        # A tenant's own pods, with labels of their own, and the operator's pods, with the job's.
        assert attempt(lambda: tenant.create_namespaced_pod(namespace, pod("own", {"app": "mine"}))) is None
        assert attempt(lambda: tenant.create_namespaced_pod(namespace, pod("bare"))) is None
        assert attempt(lambda: operator.create_namespaced_pod(namespace, pod("train-worker-0", worker))) is None

        # Updates that keep the job's labels as they are pass, by patch and by a whole replace (the garbage
        # collector, the kubelet, a user's annotation)...
        assert attempt(lambda: tenant.patch_namespaced_pod("train-worker-0", namespace, {"metadata": {
            "annotations": {"note": "seen"}, "labels": {"app": "mine", JOB_LABEL: "train"}}})) is None
        current = tenant.read_namespaced_pod("train-worker-0", namespace)
        current.metadata.annotations["note"] = "replaced"
        assert attempt(lambda: tenant.replace_namespaced_pod("train-worker-0", namespace, current)) is None
        # ...those that add, change or remove one are refused.
        for name, labels, label in [
            ("own", {JOB_LABEL: "train"}, JOB_LABEL),  # added to a pod of the tenant's
            ("train-worker-0", {JOB_LABEL: "other"}, JOB_LABEL),  # changed
            ("train-worker-0", {ROLE_LABEL: None}, ROLE_LABEL),  # removed: the worker would leave its fence
        ]:
            exc = attempt(relabel(tenant, namespace, name, labels))
            assert refused_for(exc, label, operator_user), (name, labels, exc and exc.body)
        assert tenant.read_namespaced_pod("train-worker-0", namespace).metadata.labels == {
            **worker, "app": "mine"}
        # The operator may.
        assert attempt(relabel(operator, namespace, "own", {JOB_LABEL: "train"})) is None

