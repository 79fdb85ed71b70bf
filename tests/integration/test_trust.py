"""Pods the operator did not make change nothing about a job, whatever their labels and owner references.

The attacker here is anyone allowed to create pods in the job's namespace and read the job (its uid): the
pods they create carry the job's labels and a controller ownerReference to the job, exactly as the operator's
own do.
"""

from __future__ import annotations

from jobapi import (
    GROUP,
    PLURAL,
    VERSION,
    create,
    get_job,
    job_manifest,
    pod_spec,
    pods,
    status_of,
    wait_phase,
    wait_pods,
)
from kubernetes import client

from helpers import wait_for

# torchrun's own words when it gives up (the Root Cause block), printed by a pod that is not torchrun.
FAKE_ROOT_CAUSE = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\\n"
                   "Root Cause (first observed failure):\\n[0]:\\n  exitcode  : 3 (pid: 18)\\n")


def forged_pod(job: dict, name: str, command: list[str], role: str = "worker", index: str = "1",
               annotations: dict | None = None) -> dict:
    meta = job["metadata"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"elasticjob.dev/job-name": meta["name"], "elasticjob.dev/role": role,
                       "elasticjob.dev/replica-index": index},
            "annotations": annotations or {},
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": False}],
        },
        "spec": pod_spec([{"name": "worker", "command": command, "terminationMessagePolicy": "FallbackToLogsOnError"}],
                         restartPolicy="Never", terminationGracePeriodSeconds=1),
    }


def phases(api, namespace, names):
    found = {p.metadata.name: p.status.phase for p in api[1].list_namespaced_pod(namespace).items}
    return {n: found.get(n, "gone") for n in names}


def ended(found):
    return all(phase in ("Succeeded", "Failed", "gone") for phase in found.values())


def test_forged_pods_change_nothing(api, namespace, operator):
    create(api, namespace, job_manifest("train", failurePolicy={"fatalExitCodes": [3]}))
    wait_phase(api, namespace, "train", "Running")
    real = wait_pods(api, namespace, 2)
    job = get_job(api, namespace, "train")
    # A real pod's serial and mark, copied onto another name: the mark is bound to the name it was made for.
    copied = {k: v for k, v in (real[0].metadata.annotations or {}).items() if k.startswith("elasticjob.dev/")}
    forged = {
        "train-fake-ok": ["python", "-c", "pass"],
        "train-fake-fail": ["python", "-c", "import sys; sys.exit(1)"],
        "train-fake-fatal": ["python", "-c", f"import sys; print('{FAKE_ROOT_CAUSE}'); sys.exit(1)"],
        "train-fake-copy": ["python", "-c", "import sys; sys.exit(3)"],
    }
    for name, command in forged.items():
        annotations = copied if name == "train-fake-copy" else None
        api[1].create_namespaced_pod(namespace, forged_pod(job, name, command, annotations=annotations))
    wait_for(lambda: phases(api, namespace, forged), 60, "the forged pods to end", until=ended)
    # A change the operator must act on: once it shows, the operator has planned with the forged pods ended.
    api[0].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train", {"spec": {"replicas": 3}})
    status = wait_for(lambda: status_of(api, namespace, "train"), 60, "3 workers ready",
                      until=lambda s: s.get("readyReplicas") == 3 and s.get("observedGeneration") == 2)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Running", "Running", 0)
    assert status.get("lastFailures", []) == []
    assert status["replicas"] == 3  # the forged pods are not counted
    assert status.get("infrastructureFailures", 0) == 0
    assert [p.metadata.name for p in pods(api, namespace) if not p.metadata.name.startswith("train-fake")] == [
        "train-worker-0", "train-worker-1", "train-worker-2"]
    # The forged pods are left alone: not the operator's to count, and not its to delete either.
    assert "gone" not in phases(api, namespace, forged).values()


def slice_addresses(kube, namespace: str, service: str) -> list[str]:
    slices = client.DiscoveryV1Api(kube).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}").items
    return sorted(a for s in slices for e in s.endpoints or [] for a in e.addresses)


def test_a_pod_labelled_as_the_store_gets_no_traffic(api, namespace, operator, kube):
    create(api, namespace, job_manifest("train"))
    wait_phase(api, namespace, "train", "Running")
    store = wait_for(lambda: pods(api, namespace, "rendezvous"), 30, "the store pod", until=lambda p: len(p) == 1)[0]
    job = get_job(api, namespace, "train")
    impostor = forged_pod(job, "train-fake-rdzv", ["python", "-c", "import time; time.sleep(3600)"],
                          role="rendezvous")
    del impostor["metadata"]["labels"]["elasticjob.dev/replica-index"]
    api[1].create_namespaced_pod(namespace, impostor)
    wait_for(lambda: api[1].read_namespaced_pod("train-fake-rdzv", namespace).status, 60, "the impostor ready",
             until=lambda s: any(c.type == "Ready" and c.status == "True" for c in s.conditions or []))
    api[0].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train", {"spec": {"replicas": 3}})
    status = wait_for(lambda: status_of(api, namespace, "train"), 60, "3 workers ready",
                      until=lambda s: s.get("readyReplicas") == 3 and s.get("observedGeneration") == 2)
    assert slice_addresses(kube, namespace, "train-rdzv") == [store.status.pod_ip]
    assert (status["phase"], status["restarts"], status["rendezvous"]["restarts"]) == ("Running", 0, 0)


# --- the rendezvous Service's endpoints and name (issue 33 M2, M3) -----------------------------------------------

FOREIGN_IP = "10.9.9.9"


def events(api, namespace, reason):
    return [e.message for e in api[1].list_namespaced_event(namespace).items if e.reason == reason]


def running_store(api, namespace, name="train"):
    wait_phase(api, namespace, name, "Running")
    return wait_for(lambda: pods(api, namespace, "rendezvous"), 30, "the store pod", until=lambda p: len(p) == 1)[0]


def test_an_endpoint_slice_the_operator_did_not_make_is_deleted(api, namespace, operator, kube):
    create(api, namespace, job_manifest("train"))
    store = running_store(api, namespace)
    wait_for(lambda: slice_addresses(kube, namespace, "train-rdzv"), 30, "the store's endpoint",
             until=lambda found: found == [store.status.pod_ip])
    foreign = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
               "metadata": {"name": "train-extra", "labels": {"kubernetes.io/service-name": "train-rdzv"}},
               "endpoints": [{"addresses": [FOREIGN_IP], "conditions": {"ready": True}}],
               "ports": [{"name": "rendezvous", "port": 29400, "protocol": "TCP"}]}
    client.DiscoveryV1Api(kube).create_namespaced_endpoint_slice(namespace, foreign)
    wait_for(lambda: slice_addresses(kube, namespace, "train-rdzv"), 30, "the foreign slice deleted",
             until=lambda found: found == [store.status.pod_ip])
    messages = wait_for(lambda: events(api, namespace, "ForeignEndpoints"), 30, "a ForeignEndpoints Event")
    assert "train-extra" in messages[0] and FOREIGN_IP in messages[0]


def test_an_endpoints_object_of_the_service_name_is_not_mirrored_into_it(api, namespace, operator, kube):
    create(api, namespace, job_manifest("train"))
    store = running_store(api, namespace)
    endpoints = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "train-rdzv"},
                 "subsets": [{"addresses": [{"ip": FOREIGN_IP}], "ports": [{"name": "rendezvous", "port": 29400}]}]}
    api[1].create_namespaced_endpoints(namespace, endpoints)

    def left():
        names = [e.metadata.name for e in api[1].list_namespaced_endpoints(namespace).items]
        return "train-rdzv" in names, slice_addresses(kube, namespace, "train-rdzv")

    # Kubernetes' mirroring controller copies it into a slice of the Service; the operator deletes both.
    wait_for(left, 30, "the Endpoints object and its mirrored slice gone",
             until=lambda found: found == (False, [store.status.pod_ip]))
    wait_for(lambda: events(api, namespace, "ForeignEndpoints"), 30, "a ForeignEndpoints Event")


def test_a_service_made_again_by_someone_else_is_replaced_not_adopted(api, namespace, operator_factory):
    first = operator_factory()
    create(api, namespace, job_manifest("train"))
    running_store(api, namespace)
    real = api[1].read_namespaced_service("train-rdzv", namespace)
    wait_for(lambda: status_of(api, namespace, "train")["rendezvous"].get("serviceUid"), 30,
             "the Service's uid recorded", until=lambda uid: uid == real.metadata.uid)
    first.stop()
    # Its labels, owner reference and mark copied onto a Service made after it was deleted, with a selector.
    api[1].delete_namespaced_service("train-rdzv", namespace)
    wait_for(lambda: [s.metadata.name for s in api[1].list_namespaced_service(namespace).items], 30,
             "the Service gone", until=lambda names: "train-rdzv" not in names)
    meta = real.metadata
    copy = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "train-rdzv", "labels": meta.labels, "annotations": meta.annotations,
                         "ownerReferences": [{"apiVersion": r.api_version, "kind": r.kind, "name": r.name,
                                              "uid": r.uid, "controller": r.controller} for r in meta.owner_references]},
            "spec": {"selector": {"elasticjob.dev/role": "rendezvous"},
                     "ports": [{"name": "rendezvous", "port": 29400, "targetPort": 29400}]}}
    impostor = api[1].create_namespaced_service(namespace, copy).metadata.uid
    operator_factory()
    service = wait_for(lambda: api[1].read_namespaced_service("train-rdzv", namespace), 60,
                       "the Service replaced", until=lambda s: s.metadata.uid not in (impostor, meta.uid),
                       ignore=(client.exceptions.ApiException,))
    assert not service.spec.selector
    assert wait_for(lambda: events(api, namespace, "ServiceReplaced"), 30, "a ServiceReplaced Event")
    wait_for(lambda: status_of(api, namespace, "train")["rendezvous"].get("serviceUid"), 30,
             "the new Service's uid recorded", until=lambda uid: uid == service.metadata.uid)


def test_a_name_another_object_holds_is_taken_under_a_suffix(api, namespace, operator):
    """An unlabelled pod and Service under the names the job's store and Service would have."""
    squatter = forged_pod({"metadata": {"name": "train", "uid": "0"}}, "train-rdzv", ["python", "-c", "pass"])
    del squatter["metadata"]["labels"]
    del squatter["metadata"]["ownerReferences"]
    api[1].create_namespaced_pod(namespace, squatter)
    api[1].create_namespaced_service(namespace, {"apiVersion": "v1", "kind": "Service",
                                                 "metadata": {"name": "train-rdzv"},
                                                 "spec": {"ports": [{"port": 80}]}})
    create(api, namespace, job_manifest("train"))
    store = running_store(api, namespace)
    renamed = status_of(api, namespace, "train")["renamed"]
    assert set(renamed) == {"Pod/train-rdzv", "Service/train-rdzv"}
    assert store.metadata.name == renamed["Pod/train-rdzv"] and store.metadata.name.startswith("train-rdzv-")
    service = api[1].read_namespaced_service(renamed["Service/train-rdzv"], namespace)
    assert status_of(api, namespace, "train")["rendezvous"]["endpoint"].startswith(service.spec.cluster_ip)
    messages = events(api, namespace, "NameTaken")
    assert any("Pod train-rdzv" in m for m in messages) and any("Service train-rdzv" in m for m in messages)
    assert api[1].read_namespaced_pod("train-rdzv", namespace).metadata.labels is None  # left alone
