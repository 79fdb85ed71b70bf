"""`kubectl delete -f job.yaml && kubectl apply -f job.yaml`: the new job starts at once, beside the old one's
pods that are still terminating, and never counts them nor meets them in its rendezvous."""

from __future__ import annotations

import time

from jobapi import GROUP, PLURAL, VERSION, create, get_job, job_manifest, status_of, wait_phase, wait_pods
from kubernetes.client.exceptions import ApiException

from helpers import wait_for

# Ignores SIGTERM: the pod lasts its whole grace period (the local cluster runs no preStop hook; the one in the
# manifest holds a real kubelet's pod as long).
STUBBORN = ["python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"]
GRACE = 30


def slow_to_go(name: str) -> dict:
    manifest = job_manifest(name, command=STUBBORN)
    spec = manifest["spec"]["template"]["spec"]
    spec["terminationGracePeriodSeconds"] = GRACE
    spec["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(GRACE)]}}}
    return manifest


def job_pods(api, namespace, uid):
    return [p for p in api[1].list_namespaced_pod(namespace).items
            if any(r.uid == uid for r in p.metadata.owner_references or [])]


def gone(api, namespace, name):
    try:
        get_job(api, namespace, name)
    except ApiException as err:
        return err.status == 404
    return False


def test_a_reapplied_job_starts_while_the_old_pods_terminate(api, namespace, operator):
    create(api, namespace, slow_to_go("train"))
    wait_phase(api, namespace, "train", "Running")
    wait_pods(api, namespace, 2)
    old_uid = get_job(api, namespace, "train")["metadata"]["uid"]
    api[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train")
    wait_for(lambda: gone(api, namespace, "train"), 30, "the old job gone")
    applied = time.monotonic()
    new_uid = create(api, namespace, slow_to_go("train"))["metadata"]["uid"]
    running = wait_for(lambda: [p for p in job_pods(api, namespace, new_uid) if p.status.phase == "Running"
                                and p.metadata.labels.get("elasticjob.dev/role") == "worker"],
                       5, "a worker of the new job running within 5 s of the re-apply")
    took = time.monotonic() - applied
    old = job_pods(api, namespace, old_uid)
    assert old and all(p.metadata.deletion_timestamp for p in old), "the old pods were still terminating"
    print(f"first worker of the re-applied job running {took:.1f}s after the apply ({running[0].metadata.name}), "
          f"{len(old)} old pods terminating")
    status = wait_for(lambda: status_of(api, namespace, "train"), 60, "the new job running with 2 workers",
                      until=lambda s: s.get("phase") == "Running" and s.get("readyReplicas") == 2)
    assert (status["replicas"], status["restarts"], status.get("lastFailures", [])) == (2, 0, [])
    assert status["rendezvous"]["runId"] == new_uid
    # The new workers rendezvous at the new job's Service, under its run id: the old agents, if any still ran,
    # would knock at the old one's (gone) under another.
    new_env = [{e.name: e.value for e in p.spec.containers[0].env} for p in job_pods(api, namespace, new_uid)
               if p.metadata.labels.get("elasticjob.dev/role") == "worker"]
    old_env = [{e.name: e.value for e in p.spec.containers[0].env} for p in old
               if p.metadata.labels.get("elasticjob.dev/role") == "worker"]
    assert {e["PET_RDZV_ID"] for e in new_env} == {new_uid}
    assert {e["PET_RDZV_ENDPOINT"] for e in new_env} == {status["rendezvous"]["endpoint"]}
    assert not {e["PET_RDZV_ENDPOINT"] for e in old_env} & {status["rendezvous"]["endpoint"]}
