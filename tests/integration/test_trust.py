"""Pods the operator did not make change nothing about a job, whatever their labels and owner references.

The attacker here is anyone allowed to create pods in the job's namespace and read the job (its uid): the
pods they create carry the job's labels and a controller ownerReference to the job, exactly as the operator's
own do.
"""

from __future__ import annotations

from jobapi import GROUP, PLURAL, VERSION, create, get_job, job_manifest, pods, status_of, wait_phase, wait_pods
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
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "worker", "image": "trainer:test", "command": command,
                                 "terminationMessagePolicy": "FallbackToLogsOnError"}]},
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
