"""Desired objects built from a job."""

from __future__ import annotations

from factory import UID, spec, template

from elasticjob import builders
from elasticjob.builders import JobRef


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


def test_rendezvous_pod_runs_a_store_in_the_worker_image():
    pod = builders.rendezvous_pod(ref(rendezvous={"port": 29500}))
    container = pod["spec"]["containers"][0]
    assert container["image"] == "trainer:1"
    assert container["command"][:2] == ["python", "-c"] and "TCPStore" in container["command"][2]
    assert container["readinessProbe"]["tcpSocket"]["port"] == 29500
    assert [p["containerPort"] for p in container["ports"]] == [29500, 29501]
    assert {"name": "ELASTICJOB_RDZV_RUN_ID", "value": UID} in container["env"]
    assert pod["metadata"]["labels"]["elasticjob.dev/role"] == "rendezvous"


def test_rendezvous_image_can_be_overridden():
    pod = builders.rendezvous_pod(ref(rendezvous={"image": "torch-store:2.13"}))
    assert pod["spec"]["containers"][0]["image"] == "torch-store:2.13"


def test_rendezvous_service_selects_only_the_store():
    svc = builders.rendezvous_service(ref())
    assert svc["spec"]["selector"] == {"elasticjob.dev/job-name": "train", "elasticjob.dev/role": "rendezvous"}
    assert [p["port"] for p in svc["spec"]["ports"]] == [29400, 29401]


def test_rendezvous_script_compiles():
    compile(builders.RENDEZVOUS_SCRIPT, "<rendezvous>", "exec")
