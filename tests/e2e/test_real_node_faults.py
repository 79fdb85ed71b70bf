"""Faults that only a real node makes: the kernel's OOM killer under a container's memory limit (runc's cgroup,
the kubelet's report), and the kubelet killing a container whose liveness probe fails. Runs where the nodes are
real (`make e2e`); elsewhere it says it skipped.
"""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from e2e_support import HOST_ROOT, job_manifest, summary, train_args
from helpers import wait_for
from test_training import finish, recovery, start


# In `make e2e`, not `make test`: as the first job after the cluster started, 3 runs of 7 charged nothing (the
# operator, on this host, logged no round of the store at all); later jobs were charged once every time.
@pytest.mark.slow
def test_a_worker_killed_by_the_oom_killer_is_charged_once_and_training_resumes(
        real_nodes, operator, jobs, progress, record_recovery):
    steps, oom_at = 30, 8
    manifest = job_manifest(jobs.namespace, train_args=train_args(steps, extra=("--oom-at-step", oom_at)))
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": "512Mi"}, "limits": {"memory": "1Gi"}}
    before = start(jobs, progress, manifest, world_size=2, min_step=oom_at - 1)
    fault_time = max(r["time"] for r in before.records if r["step"] == oom_at - 1)
    resumed = recovery(progress, fault_time, "the OOM kill of rank 0", world_size=2)
    finish(jobs, progress, steps)
    status = jobs.status()
    # The kernel kills the worker process, the largest in the container's cgroup, not torchrun's agent (the
    # container's main process): the kubelet sees no container end, the agents restart the group in place, and
    # the store's failure round is what the operator charges, once.
    assert status.get("restarts") == 1, summary(status)
    failures = status.get("lastFailures", [])
    assert len(failures) == 1 and failures[0]["charged"], failures
    # SIGKILL, as torchrun reports a signalled worker, on the pod that held rank 0 (ranks follow the rendezvous,
    # not the pods' indexes); not the peer whose collective then failed (exit 1)
    assert (failures[0]["pod"], failures[0].get("exitCode")) == (before.rank0_host(), -9), failures
    pods = jobs.worker_pods()
    assert all(s.restart_count == 0 for p in pods for s in p.status.container_statuses or []), jobs.pods_summary()
    record_recovery("OOM kill of rank 0 (memory limit 1Gi)", resumed["time"] - fault_time, resumed["world_size"],
                    status.get("restarts"))


@pytest.mark.slow
def test_a_worker_whose_liveness_probe_fails_is_replaced_and_charged_once(
        real_nodes, local_cluster, operator, jobs, progress, record_recovery):
    steps, victim = 40, "train-worker-1"
    manifest = job_manifest(jobs.namespace, train_args=train_args(steps))
    # Unhealthy once a marker named after the pod appears in the shared checkpoint dir (a hostPath here).
    manifest["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {
        "exec": {"command": ["sh", "-c", "test ! -e /ckpt/unhealthy-$(hostname)"]},
        "periodSeconds": 1, "failureThreshold": 2}
    before = start(jobs, progress, manifest, world_size=2, min_step=5)
    first = jobs.pod(victim).metadata.uid
    marker = HOST_ROOT / jobs.namespace / f"unhealthy-{victim}"
    fault_time = before.records[-1]["time"]
    marker.touch()
    try:
        # Until the first pod of that name has failed or gone: its replacement (same name) must stay healthy.
        wait_for(lambda: pod_or_none(jobs, victim), 30, f"the kubelet to kill {victim}",
                 until=lambda pod: pod is None or pod.metadata.uid != first or pod.status.phase == "Failed")
    finally:
        marker.unlink()
    resumed = recovery(progress, fault_time, f"the liveness kill of {victim}")
    finish(jobs, progress, steps)
    status = jobs.status()
    failures = [f for f in status.get("lastFailures", []) if f["charged"]]
    assert status.get("restarts") == 1 and [f["pod"] for f in failures] == [victim], (
        summary(status), status.get("lastFailures"))
    record_recovery(f"liveness probe of {victim} fails", resumed["time"] - fault_time, resumed["world_size"],
                    status.get("restarts"))


def pod_or_none(jobs, name: str):
    try:
        return jobs.pod(name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
