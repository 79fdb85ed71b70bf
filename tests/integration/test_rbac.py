"""The chart's RBAC on a real API server: the operator's ServiceAccount may do what the operator does, and no more.

The ServiceAccount, roles and bindings are rendered by Helm from the chart and applied as they are; the
API server's own authorizer answers (SubjectAccessReview). Then the operator runs with that account's
token and must drive a job without a single Forbidden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chart_rbac import allowed, service_account_kubeconfig
from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
# An operator log line with any of these means a call the chart's RBAC did not allow.
PERMISSION_ERRORS = ("Forbidden", "forbidden", " 403", "Not enough permissions")

# (verb, group, resource, subresource) the operator uses in each namespace it watches.
OPERATOR_NEEDS = [
    ("get", GROUP, "elasticjobs", ""), ("list", GROUP, "elasticjobs", ""), ("watch", GROUP, "elasticjobs", ""),
    ("patch", GROUP, "elasticjobs", ""), ("delete", GROUP, "elasticjobs", ""),
    ("patch", GROUP, "elasticjobs", "status"),
    ("get", "", "pods", ""), ("list", "", "pods", ""), ("watch", "", "pods", ""), ("create", "", "pods", ""),
    ("delete", "", "pods", ""), ("get", "", "pods", "log"),
    ("get", "", "services", ""), ("list", "", "services", ""), ("watch", "", "services", ""),
    ("create", "", "services", ""), ("delete", "", "services", ""),
    ("list", "discovery.k8s.io", "endpointslices", ""), ("watch", "discovery.k8s.io", "endpointslices", ""),
    ("create", "discovery.k8s.io", "endpointslices", ""), ("patch", "discovery.k8s.io", "endpointslices", ""),
    ("delete", "discovery.k8s.io", "endpointslices", ""), ("delete", "", "endpoints", ""),
    ("create", "networking.k8s.io", "networkpolicies", ""), ("get", "networking.k8s.io", "networkpolicies", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
    ("create", "", "events", ""),
]
# Cluster-scoped: the operator reads the node of a pod stuck terminating. kopf scans nothing (no CRD or
# namespace watches), so neither is granted.
KOPF_CLUSTER_NEEDS = [("get", "", "nodes", "")]
# Things the operator never does, in its own namespace.
NEVER_IN_NAMESPACE = [
    ("get", "", "secrets", ""), ("list", "", "secrets", ""), ("watch", "", "secrets", ""),
    ("update", "", "secrets", ""), ("delete", "", "secrets", ""), ("create", "", "secrets", ""),
    ("get", "", "configmaps", ""),
    ("create", "apps", "deployments", ""), ("create", "", "pods", "exec"),
    ("update", GROUP, "elasticjobs", ""), ("create", GROUP, "elasticjobs", ""),
    ("update", GROUP, "elasticjobs", "scale"), ("patch", GROUP, "elasticjobs", "scale"),
    ("update", GROUP, "elasticjobs", "status"),
    ("update", "", "pods", ""), ("patch", "", "pods", ""), ("patch", "", "services", ""),
    ("patch", "", "events", ""), ("create", "rbac.authorization.k8s.io", "roles", ""),
    ("create", "", "configmaps", ""),
]
# Only with the chart's gangScheduling.* values; Kueue's unless kueue.mode is off.
GANG_NEEDS = [
    ("get", "scheduling.k8s.io", "podgroups", ""), ("create", "scheduling.k8s.io", "podgroups", ""),
    ("delete", "scheduling.k8s.io", "podgroups", ""),
    ("get", "scheduling.x-k8s.io", "podgroups", ""), ("create", "scheduling.x-k8s.io", "podgroups", ""),
    ("patch", "scheduling.x-k8s.io", "podgroups", ""),
]
KUEUE_NEEDS = [
    ("list", "kueue.x-k8s.io", "workloads", ""), ("watch", "kueue.x-k8s.io", "workloads", ""),
    ("create", "kueue.x-k8s.io", "workloads", ""), ("patch", "kueue.x-k8s.io", "workloads", ""),
    ("patch", "kueue.x-k8s.io", "workloads", "status"), ("delete", "kueue.x-k8s.io", "workloads", ""),
]
KUEUE_CLUSTER_NEEDS = [
    ("list", "kueue.x-k8s.io", "resourceflavors", ""), ("watch", "kueue.x-k8s.io", "resourceflavors", ""),
    ("get", "kueue.x-k8s.io", "workloadpriorityclasses", ""), ("get", "scheduling.k8s.io", "priorityclasses", ""),
]
# Never, even with those values on: Kueue owns its queues and the Workloads' status beyond what a job integration writes.
NEVER_WITH_GANGS_AND_KUEUE = [
    ("update", "kueue.x-k8s.io", "workloads", ""),
    ("update", "kueue.x-k8s.io", "workloads", "status"), ("create", "kueue.x-k8s.io", "clusterqueues", ""),
    ("patch", "kueue.x-k8s.io", "localqueues", ""), ("list", "scheduling.k8s.io", "podgroups", ""),
    ("patch", "scheduling.k8s.io", "podgroups", ""), ("delete", "scheduling.x-k8s.io", "podgroups", ""),
    ("watch", "scheduling.x-k8s.io", "podgroups", ""), ("create", "scheduling.k8s.io", "workloads", ""),
]
NEVER_CLUSTER_WIDE = [
    ("delete", "", "nodes", ""), ("list", "", "nodes", ""), ("delete", "", "namespaces", ""),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("get", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("list", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("watch", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("list", "", "namespaces", ""), ("watch", "", "namespaces", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
]


def decisions(kube, user: str, table: list[tuple[str, str, str, str]], namespace: str) -> dict[str, bool]:
    return {f"{verb} {group or 'core'}/{resource}{'/' + sub if sub else ''} in {namespace or 'cluster'}":
            allowed(kube, user, verb, group, resource, sub, namespace)
            for verb, group, resource, sub in table}


def assert_all(kube, user: str, table, namespace: str, expected: bool) -> None:
    wrong = {what: got for what, got in decisions(kube, user, table, namespace).items() if got is not expected}
    assert not wrong, f"{user}: expected {'allowed' if expected else 'denied'} but got the opposite for {wrong}"


def test_namespaced_install_grants_exactly_what_the_operator_needs(kube, namespace, crds_installed, install_rbac):
    user = install_rbac({"watch": {"allNamespaces": False, "namespaces": [namespace]}}, namespace)
    # RBAC caches refresh on watch events: wait until the first grant is in force, then ask everything.
    wait_for(lambda: allowed(kube, user, "list", GROUP, "elasticjobs", "", namespace), 30,
             f"{user} to be allowed to list elasticjobs")
    assert_all(kube, user, OPERATOR_NEEDS, namespace, True)
    assert_all(kube, user, KOPF_CLUSTER_NEEDS, "", True)
    assert_all(kube, user, NEVER_IN_NAMESPACE, namespace, False)
    assert_all(kube, user, NEVER_CLUSTER_WIDE, "", False)
    # A namespace list means that list: nothing of the operator's reaches other namespaces or the cluster.
    assert_all(kube, user, OPERATOR_NEEDS, "kube-system", False)
    assert_all(kube, user, [n for n in OPERATOR_NEEDS if n[0] in ("list", "watch")], "", False)


def test_cluster_wide_install_grants_the_operator_everywhere_but_no_more(kube, namespace, crds_installed,
                                                                          install_rbac):
    user = install_rbac({}, namespace)
    wait_for(lambda: allowed(kube, user, "list", GROUP, "elasticjobs", "", ""), 30,
             f"{user} to be allowed to list elasticjobs cluster-wide")
    assert_all(kube, user, [n for n in OPERATOR_NEEDS if n[0] in ("list", "watch")], "", True)
    assert_all(kube, user, OPERATOR_NEEDS, "kube-system", True)
    assert_all(kube, user, KOPF_CLUSTER_NEEDS, "", True)
    assert_all(kube, user, NEVER_IN_NAMESPACE, "kube-system", False)
    assert_all(kube, user, NEVER_CLUSTER_WIDE, "", False)


def test_gang_and_kueue_grants_come_only_with_their_values(kube, namespace, crds_installed, install_rbac):
    scoped = {"watch": {"allNamespaces": False, "namespaces": [namespace]}}
    plain = install_rbac({**scoped, "kueue": {"mode": "off"}}, namespace)
    full = install_rbac({**scoped, "gangScheduling": {"workloadAPI": True, "coscheduling": True},
                         "kueue": {"mode": "on"}}, namespace)
    for user in (plain, full):
        wait_for(lambda: allowed(kube, user, "list", GROUP, "elasticjobs", "", namespace), 30,
                 f"{user} to be allowed to list elasticjobs")
    wait_for(lambda: allowed(kube, full, "create", "kueue.x-k8s.io", "workloads", "", namespace), 30,
             f"{full} to be allowed to create workloads")
    assert_all(kube, plain, GANG_NEEDS + KUEUE_NEEDS, namespace, False)
    assert_all(kube, plain, KUEUE_CLUSTER_NEEDS, "", False)
    assert_all(kube, full, GANG_NEEDS + KUEUE_NEEDS + OPERATOR_NEEDS, namespace, True)
    assert_all(kube, full, KUEUE_CLUSTER_NEEDS, "", True)
    assert_all(kube, full, NEVER_WITH_GANGS_AND_KUEUE + NEVER_IN_NAMESPACE, namespace, False)
    assert_all(kube, full, GANG_NEEDS + KUEUE_NEEDS, "kube-system", False)


# ---------------------------------------------------------------- the operator under its own account


def small_job(name: str) -> dict[str, Any]:
    # Workers may never be scheduled (no node has the label): the test is about the operator's API calls.
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "nprocPerNode": 1,
                 "runPolicy": {"ttlSecondsAfterFinished": 0}, "template": {"spec": {
            "nodeSelector": {"elasticjob.dev/test": "no-such-node"},
            "containers": [{"name": "worker", "image": "elasticjob-worker:cpu",
                            "command": ["torchrun", "/workspace/examples/train_ddp.py"]}]}}},
    }


def test_operator_runs_as_its_service_account_without_forbidden(kube, cluster, namespace, crds_installed,
                                                                 install_rbac, operator_factory, tmp_path):
    user = install_rbac({"watch": {"allNamespaces": False, "namespaces": [namespace]}}, namespace)
    account = user.rsplit(":", 1)[1]
    wait_for(lambda: allowed(kube, user, "create", "", "pods", "", namespace), 30, f"{user} to be allowed pods")
    kubeconfig = service_account_kubeconfig(kube, Path(cluster.kubeconfig), namespace, account,
                                            tmp_path / "operator.kubeconfig")
    operator = operator_factory(namespaces=[namespace], env={"KUBECONFIG": str(kubeconfig)})
    operator.wait_for_log("elasticjob operator started", timeout=60)

    core = client.CoreV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, small_job("rbac"))
    wanted_pods = {"rbac-rdzv", "rbac-worker-0", "rbac-worker-1"}

    def pod_names() -> set[str]:
        return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}

    # Creating pods and the Service, patching the job (spec.replicas default, status).
    service = wait_for(lambda: core.read_namespaced_service("rbac-rdzv", namespace), 60,
                       "the rendezvous Service rbac-rdzv", ignore=(ApiException,))
    assert service.spec.cluster_ip
    wait_for(pod_names, 60, f"pods {sorted(wanted_pods)}", until=lambda names: wanted_pods <= names)
    job = wait_for(lambda: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rbac"), 60,
                   "the operator to default spec.replicas and write status",
                   until=lambda j: j["spec"].get("replicas") == 2 and (j.get("status") or {}).get("phase"))
    assert not job["metadata"].get("finalizers"), "the operator must not block deletion of jobs"
    events = wait_for(lambda: core.list_namespaced_event(namespace, field_selector="involvedObject.name=rbac").items,
                      60, "an Event posted by the operator about the job")

    # Deleting pods, the Service and the job: let it run out of time; ttlSecondsAfterFinished=0 removes it.
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rbac",
                                          {"spec": {"runPolicy": {"activeDeadlineSeconds": 1}}})
    wait_for(pod_names, 60, "every pod of the failed job to be deleted",
             until=lambda names: not (names & wanted_pods))
    wait_for(lambda: [s.metadata.name for s in core.list_namespaced_service(namespace).items], 60,
             "the rendezvous Service to be deleted", until=lambda names: "rbac-rdzv" not in names)
    wait_for(lambda: [j["metadata"]["name"] for j in
                      custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]], 60,
             "the operator to delete the finished job",
             until=lambda names: "rbac" not in names)

    log = operator.log_text()
    denied = [line for line in log.splitlines() if any(marker in line for marker in PERMISSION_ERRORS)]
    assert not denied, f"operator hit permission errors ({len(events)} events seen):\n" + "\n".join(denied[:10])
