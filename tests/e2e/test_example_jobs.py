"""The examples as a user applies them: the script's ConfigMap made from examples/train_ddp.py as their headers say
(`kubectl create configmap train-ddp --from-file=...`), then the job, trained to `Succeeded`. The public PyTorch
image they name is the one change: this machine cannot reach Docker Hub, so the worker image as this cluster names
it (torch 2.13, CPU) runs in its place, through the operator's kit as any image would, and each test keeps its
checkpoints in a hostPath of its own (the example's is shared with `make run`'s job of the same name, whose last
checkpoint would end this one at once). examples/elasticjob.yaml runs as written but for those; examples/gpu/
elasticjob.yaml sized to the local nodes, which advertise 2 fake GPUs each (localcluster/fakegpu): 2 GPUs and 1 CPU
a pod, 2 pods, the checkpoint PVC a hostPath, a short run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.utils import parse_quantity

from e2e_support import STORE_CPU, WORKER_IMAGE, Jobs, exit_codes, free_cpu
from localcluster import examplescript

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FINISH_TIMEOUT = 240  # the GPU example's two processes a pod import torch on 2 shared cores


def example(relative: str, namespace: str) -> dict:
    """The example's ElasticJob, in the test's namespace, with the worker image as this cluster names it and its
    checkpoints in the test's own hostPath."""
    (job,) = [doc for doc in yaml.safe_load_all((EXAMPLES / relative).read_text())
              if doc and doc.get("kind") == "ElasticJob"]
    job["metadata"]["namespace"] = namespace
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("pytorch/pytorch:"), "the examples name PyTorch's public image"
    container["image"] = WORKER_IMAGE
    checkpoints = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "checkpoints")
    checkpoints.pop("persistentVolumeClaim", None)
    checkpoints["hostPath"] = {"path": f"/tmp/elasticjob-e2e/{namespace}", "type": "DirectoryOrCreate"}
    return job


def skip_unless_it_fits(jobs: Jobs, job: dict, workers: int) -> None:
    """The example as written needs its workers' CPU requests and its store's free on the cluster: a one-node kind
    on this 2-core machine has about 0.9 cores left beside its control plane, where the example trains at 1."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    asked = workers * parse_quantity(container["resources"]["requests"]["cpu"]) + STORE_CPU
    free = free_cpu(jobs.core)
    if free < asked:
        pytest.skip(f"{free * 1000:.0f}m CPU unrequested on the cluster; the example's {workers} workers and its "
                    f"store ask {asked * 1000:.0f}m")


def trained(jobs: Jobs, job: dict, workers: int) -> dict:
    skip_unless_it_fits(jobs, job, workers)
    examplescript.apply(jobs.api_client, jobs.namespace)
    jobs.create(job)
    name = job["metadata"]["name"]
    status = jobs.wait_phase("Succeeded", FINISH_TIMEOUT, name=name)
    pods = jobs.worker_pods(name)
    assert len(pods) == workers and set(exit_codes(pods).values()) == {0}, jobs.pods_summary(name)
    assert status.get("restarts") == 0, status
    return status


def test_the_example_trains_from_its_configmap_script(real_nodes, operator, jobs: Jobs):
    trained(jobs, example("elasticjob.yaml", jobs.namespace), workers=2)


@pytest.mark.slow  # make e2e: the CPU example (in make test) runs the same script
def test_the_gpu_example_trains_sized_to_the_local_nodes(gpu_nodes, operator, jobs: Jobs):
    job = example("gpu/elasticjob.yaml", jobs.namespace)
    spec = job["spec"]
    spec.update(replicas=2, minReplicas=2, maxReplicas=2)
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    size = {"cpu": "1", "memory": "3Gi", "nvidia.com/gpu": 2}
    container["resources"] = {"requests": dict(size), "limits": dict(size)}  # still Guaranteed
    container["args"] = ["--steps", "20", "--checkpoint-every", "5"]
    pod["terminationGracePeriodSeconds"] = 15
    trained(jobs, job, workers=2)
    assert all(p.spec.containers[0].resources.limits.get("nvidia.com/gpu") == "2" for p in jobs.worker_pods(
        job["metadata"]["name"])), "each pod got the GPUs the example asks for"
