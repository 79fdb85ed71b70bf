"""Desired objects built from a job."""

from __future__ import annotations

import hashlib
import json

import pytest
from factory import UID, spec, template

from elasticjob import builders, domain
from elasticjob.domain import JobRef


def ref(**fields):
    return JobRef(namespace="ml", name="train", uid=UID, spec=spec(**fields))


def test_worker_pod_has_deterministic_name_labels_and_owner():
    pod = builders.worker_pod(ref(), 1, "10.96.0.42:29400", 3)
    meta = pod["metadata"]
    assert meta["name"] == "train-worker-1"
    assert meta["labels"] == {"elasticjob.dev/job-name": "train", "elasticjob.dev/role": "worker",
                              "elasticjob.dev/replica-index": "1"}
    assert meta["ownerReferences"] == [{"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob",
                                        "name": "train", "uid": UID, "controller": True,
                                        "blockOwnerDeletion": True}]


def test_worker_pod_keeps_the_users_template_and_adds_ours():
    tpl = template(env=[{"name": "LR", "value": "0.1"}])
    tpl["metadata"] = {"labels": {"team": "vision"}}
    tpl["spec"]["containers"].insert(0, {"name": "sidecar", "image": "busybox"})
    pod = builders.worker_pod(ref(template=tpl), 0, "10.96.0.42:29400", 3)
    sidecar, worker = pod["spec"]["containers"]
    assert "env" not in sidecar
    assert worker["env"][0] == {"name": "LR", "value": "0.1"}
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert worker["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_template_is_not_mutated():
    r = ref()
    before = r.spec.model_dump()
    builders.worker_pod(r, 0, "10.96.0.42:29400", 3)
    assert r.spec.model_dump() == before


def test_lost_node_tolerations_are_short_unless_the_user_set_them():
    pod = builders.worker_pod(ref(), 0, "e:1", 3)
    assert {t["key"]: t["tolerationSeconds"] for t in pod["spec"]["tolerations"]} == {
        "node.kubernetes.io/unreachable": 30, "node.kubernetes.io/not-ready": 30}
    own = template()
    own["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                   "effect": "NoExecute", "tolerationSeconds": 600}]
    pod = builders.worker_pod(ref(template=own), 0, "e:1", 3)
    unreachable = [t for t in pod["spec"]["tolerations"] if t["key"] == "node.kubernetes.io/unreachable"]
    assert unreachable == own["spec"]["tolerations"]


def test_the_job_pods_give_up_on_a_silent_dns_server_fast_unless_the_template_says():
    for pod in (builders.worker_pod(ref(), 0, "e:1", 3), builders.rendezvous_pod(ref())):
        assert pod["spec"]["dnsConfig"] == {"options": [{"name": "timeout", "value": "1"},
                                                        {"name": "attempts", "value": "2"}]}
    own = template()
    own["spec"]["dnsConfig"] = {"nameservers": ["10.0.0.10"], "options": [{"name": "timeout", "value": "3"},
                                                                          {"name": "ndots", "value": "2"}]}
    pod = builders.worker_pod(ref(template=own), 0, "e:1", 3)
    assert pod["spec"]["dnsConfig"] == {"nameservers": ["10.0.0.10"], "options": [
        {"name": "timeout", "value": "3"}, {"name": "ndots", "value": "2"}, {"name": "attempts", "value": "2"}]}


@pytest.mark.parametrize("stop_grace, own, kit_image, expected", [
    (30, None, "kit:1", 65),  # stopGraceSeconds, torchrun's 30 s, 5 s for the agent: the kubelet waits for all three
    (120, None, "kit:1", 155),
    (30, 300, "kit:1", None),  # the template's own grace is the user's word and stands, longer or shorter
    (30, 10, "kit:1", None),
    (30, None, None, None),  # no kit, no agent guarding the SIGTERM: nothing to wait for
    (0, None, "kit:1", None),  # no planned stop: the kubelet's default, as before
])
def test_the_worker_pods_grace_covers_a_stop_and_torchruns_shutdown(stop_grace, own, kit_image, expected):
    tpl = template()
    if own is not None:
        tpl["spec"]["terminationGracePeriodSeconds"] = own
    pod = builders.worker_pod(ref(template=tpl, runPolicy={"stopGraceSeconds": stop_grace}), 0, "e:1", 3,
                              kit_image=kit_image)
    assert pod["spec"].get("terminationGracePeriodSeconds") == (own if expected is None else expected)


def test_rendezvous_pod_runs_the_store_module_in_the_worker_image():
    pod = builders.rendezvous_pod(ref(rendezvous={"port": 29500}, minReplicas=2, maxReplicas=4, replicas=3),
                                  token="t0ken")
    container = pod["spec"]["containers"][0]
    assert container["image"] == "trainer:1"
    assert container["command"] == ["python", "-m", "elasticjob_store"]
    assert container["readinessProbe"]["tcpSocket"]["port"] == 29501  # the control port: the gate's is fenced
    assert [p["containerPort"] for p in container["ports"]] == [29500, 29501]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ELASTICJOB_RDZV_RUN_ID"] == UID
    assert (env["ELASTICJOB_RDZV_MIN_NODES"], env["ELASTICJOB_RDZV_MAX_NODES"]) == ("2", "4")
    # The token's digest, never the token: reading the pod does not reveal it. No Secret, no volume.
    assert env["ELASTICJOB_RDZV_TOKEN_SHA256"] == hashlib.sha256(b"t0ken").hexdigest()
    assert "t0ken" not in json.dumps(pod) and "volumes" not in pod["spec"]
    assert pod["metadata"]["labels"]["elasticjob.dev/role"] == "rendezvous"
    # A memory limit: a store that leaks (or is flooded) is restarted alone, not the node's other pods evicted.
    assert container["resources"]["limits"] == {"memory": "1Gi"}


def test_rendezvous_pod_meets_pod_security_restricted():
    spec = builders.rendezvous_pod(ref())["spec"]
    container = spec["containers"][0]["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False


def test_rendezvous_pod_lands_where_the_workers_can_reach_it():
    tpl = template()
    tpl["spec"].update({"nodeSelector": {"pool": "gpu"}, "priorityClassName": "training",
                        "imagePullSecrets": [{"name": "registry"}],
                        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}})
    spec = builders.rendezvous_pod(ref(template=tpl))["spec"]
    for key in ("nodeSelector", "priorityClassName", "imagePullSecrets", "affinity"):
        assert spec[key] == tpl["spec"][key]
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_rendezvous_pod_leaves_the_workers_pod_affinity_behind():
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}
    apart = {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"elasticjob.dev/role": "worker"}}}]}
    tpl = template()
    tpl["spec"]["affinity"] = {"nodeAffinity": node_affinity, "podAntiAffinity": apart, "podAffinity": apart}
    assert builders.rendezvous_pod(ref(template=tpl))["spec"]["affinity"] == {"nodeAffinity": node_affinity}
    tpl["spec"]["affinity"] = {"podAntiAffinity": apart}
    assert "affinity" not in builders.rendezvous_pod(ref(template=tpl))["spec"]


def test_one_network_policy_fences_every_store_of_a_namespace():
    policy = builders.network_policy("ml", domain.Settings(operator_namespace="elasticjob-system"))
    assert policy["metadata"] == {"name": "elasticjob-rendezvous", "namespace": "ml",
                                  "labels": {"app.kubernetes.io/managed-by": "elasticjob-operator"}}
    store_port, control = policy["spec"]["ingress"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"elasticjob.dev/role": "rendezvous"}}
    assert store_port["from"] == [{"podSelector": {"matchExpressions": [
        {"key": "elasticjob.dev/job-name", "operator": "Exists"}]}}]
    # By the store container's port names: jobs of one namespace may use different port numbers.
    store = builders.rendezvous_pod(ref(rendezvous={"port": 29500}))["spec"]["containers"][0]
    names = [p["name"] for p in store["ports"]]
    assert store_port["ports"] == [{"protocol": "TCP", "port": names[0]}]
    assert control["ports"] == [{"protocol": "TCP", "port": names[1]}]
    assert control["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "elasticjob-system"}}


def test_one_network_policy_fences_every_worker_of_a_namespace():
    """Every port of every worker (rank 0's TCPStore, the collectives) admits only the namespace's job pods."""
    policy = builders.worker_network_policy("ml")
    assert policy["metadata"] == {"name": "elasticjob-workers", "namespace": "ml",
                                  "labels": {"app.kubernetes.io/managed-by": "elasticjob-operator"}}
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector == {"elasticjob.dev/role": "worker"}
    assert selector.items() <= builders.worker_pod(ref(), 0, "10.96.0.42:29400")["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchExpressions": [
        {"key": "elasticjob.dev/job-name", "operator": "Exists"}]}}]}]


def test_rendezvous_image_can_be_overridden():
    pod = builders.rendezvous_pod(ref(rendezvous={"image": "torch-store:2.13"}))
    assert pod["spec"]["containers"][0]["image"] == "torch-store:2.13"


def test_rendezvous_service_routes_only_where_the_operator_says():
    svc = builders.rendezvous_service(ref())
    assert "selector" not in svc["spec"]  # labels route to anyone's pod
    assert [p["port"] for p in svc["spec"]["ports"]] == [29400, 29401]
    endpoints = builders.rendezvous_endpoints(ref(), ("train-rdzv", "uid-r", "10.244.1.7"))
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert [e["addresses"] for e in endpoints["endpoints"]] == [["10.244.1.7"]]
    assert endpoints["endpoints"][0]["targetRef"]["uid"] == "uid-r"
    assert [(p["name"], p["port"]) for p in endpoints["ports"]] == [(p["name"], p["targetPort"])
                                                                     for p in svc["spec"]["ports"]]
    assert builders.rendezvous_endpoints(ref(), None)["endpoints"] == []


def test_the_operators_pull_secrets_follow_the_templates_own_in_every_job_pod():
    tpl = template()
    tpl["spec"]["imagePullSecrets"] = [{"name": "team"}, {"name": "shared"}]
    job = ref(template=tpl)
    worker = builders.worker_pod(job, 0, "10.96.0.42:29400", kit_image="op:1", pull_secrets=("shared", "ops"))
    store = builders.rendezvous_pod(job, kit_image="op:1", pull_secrets=("shared", "ops"))
    for pod in (worker, store):
        assert pod["spec"]["imagePullSecrets"] == [{"name": "team"}, {"name": "shared"}, {"name": "ops"}]
    bare = builders.worker_pod(ref(), 0, "10.96.0.42:29400", pull_secrets=("ops",))
    assert bare["spec"]["imagePullSecrets"] == [{"name": "ops"}]
    assert "imagePullSecrets" not in builders.rendezvous_pod(ref())["spec"]
