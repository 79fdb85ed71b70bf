"""GPUs scheduled for real: each real node's kubelet has fake GPUs from a device plugin speaking its real gRPC API
(localcluster/fakegpu, 2 `nvidia.com/gpu` per node). The scheduler places workers by them, the kubelet allocates
them (NVIDIA_VISIBLE_DEVICES), and `nprocPerNode: auto` starts one process per GPU the worker asks for; training
runs on gloo, the CPU. A worker asking for more GPUs than any node has stays Pending, and the job says why. Kueue
counts the GPUs against a ClusterQueue's quota: a job past it waits Queued until GPUs free.
"""

from __future__ import annotations

import pytest

from e2e_support import Jobs, job_manifest, train_args
from helpers import wait_for
from kueue_support import Queues, kueue, queued, queues  # noqa: F401 (fixtures)

GPUS_PER_NODE = 2  # localcluster/localcluster/realnodes/gpus.py
START_TIMEOUT = 120  # two processes per pod import torch on 2 cores


def gpu_worker(manifest: dict, gpus: int) -> dict:
    """Requests equal to limits, as the API server requires of extended resources."""
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    container["resources"] = {"requests": {"cpu": "100m", "nvidia.com/gpu": gpus},
                              "limits": {"nvidia.com/gpu": gpus}}
    manifest["spec"]["nprocPerNode"] = "auto"
    return manifest


def test_nproc_auto_runs_a_process_per_gpu_the_kubelet_allocated(gpu_nodes, operator, jobs: Jobs, progress):
    nodes = jobs.core.list_node().items
    assert all(n.status.allocatable.get("nvidia.com/gpu") == str(GPUS_PER_NODE) for n in nodes), (
        f"every real node advertises {GPUS_PER_NODE} GPUs: "
        f"{[(n.metadata.name, n.status.allocatable.get('nvidia.com/gpu')) for n in nodes]}")
    steps = 6
    jobs.create(gpu_worker(job_manifest(jobs.namespace, replicas=2, train_args=train_args(steps)), GPUS_PER_NODE))
    done = wait_for(progress, START_TIMEOUT, "a step at world size 4 (2 pods x 2 GPUs)",
                    until=lambda p: any(r["world_size"] == 4 and r["step"] >= 2 for r in p.records))
    assert {(r["rank"], r["local_rank"]) for r in done.records if r["world_size"] == 4} >= {
        (0, 0), (1, 1), (2, 0), (3, 1)}, done
    pods = jobs.worker_pods()
    assert len({p.spec.node_name for p in pods}) == 2, "each node holds one 2-GPU worker at most"
    jobs.wait_phase("Succeeded", START_TIMEOUT)


def test_a_worker_asking_for_more_gpus_than_a_node_has_waits_and_the_job_says_why(gpu_nodes, operator, jobs: Jobs):
    manifest = gpu_worker(job_manifest(jobs.namespace, replicas=1, train_args=train_args(1)), GPUS_PER_NODE + 1)
    jobs.create(manifest)
    status = wait_for(jobs.status, 60, "the job naming the scheduler's reason",
                      until=lambda s: "Insufficient nvidia.com/gpu" in (s.get("message") or ""))
    assert status["phase"] == "Pending", status
    (pod,) = jobs.worker_pods()
    assert pod.status.phase == "Pending" and not pod.spec.node_name, pod.status


@pytest.mark.slow  # make e2e: the integration tier holds jobs past Kueue's quota; here the quota is GPUs
def test_kueue_holds_a_job_past_the_gpu_quota_until_gpus_free(gpu_nodes, kueue, operator_factory, jobs: Jobs,
                                                             queues: Queues):
    """A ClusterQueue of 2 GPUs: a job of 2 one-GPU workers is admitted and trains; a second job of one
    one-GPU worker waits Queued in Kueue's words, holding no pod, until the first finishes."""
    operator_factory(extra_args=["--kueue"])
    queues.make(cpu="4", gpus=2)
    first = queued(gpu_worker(job_manifest(jobs.namespace, name="first", replicas=2, train_args=train_args(8)), 1))
    jobs.create(first)
    jobs.wait_phase("Running", START_TIMEOUT, name="first")
    workload = wait_for(lambda: (jobs.status("first").get("admission") or {}), 30, "the first job admitted",
                        until=lambda a: a.get("state") == "Admitted")
    assert workload.get("workers") == 2, workload
    jobs.create(queued(gpu_worker(job_manifest(jobs.namespace, name="second", replicas=1, train_args=train_args(4)),
                                  1)))
    status = wait_for(lambda: jobs.status("second"), 60, "the second job queued for GPUs in Kueue's words",
                      until=lambda s: s.get("phase") == "Queued" and "nvidia.com/gpu" in (s.get("message") or ""))
    assert not jobs.worker_pods("second"), status
    jobs.wait_phase("Succeeded", START_TIMEOUT, name="first")
    jobs.wait_phase("Succeeded", START_TIMEOUT, name="second")
