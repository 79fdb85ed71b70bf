"""spec.kit: Image, for images that carry the kit (the project's worker images): the job's pods get no kit init
container, one container fewer to start in each pod; the store and warm torchrun come from the image (kit.py)."""

from __future__ import annotations

import pytest
from tests.unit.factory import NOW, UID, job, observed, rdzv, spec, template, worker

from elasticjob import builders, domain, kit, planner
from elasticjob.domain import JobRef

IMAGE = "elasticjob-operator:1.0"
WARM = ["-m", "elasticjob_warm.torchrun"]


def ref(**fields) -> JobRef:
    return JobRef(namespace="ml", name="train", uid=UID, spec=spec(kit="Image", **fields))


@pytest.mark.parametrize(("command", "args", "routed"), [
    (["torchrun"], ["--nproc-per-node=2", "train.py"], ["python", *WARM, "--nproc-per-node=2", "train.py"]),
    (["/usr/local/bin/torchrun", "train.py"], None, ["python", *WARM, "train.py"]),
    (["python3", "-m", "torch.distributed.run", "t.py"], None, ["python3", *WARM, "t.py"]),
    (["/venv/bin/python"], ["-m", "elasticjob_warm.torchrun", "t.py"], ["/venv/bin/python", *WARM, "t.py"]),
    (["bash", "-c", "torchrun train.py"], None, None),  # no kit path/ to put the warm torchrun first on PATH
    (["python", "train.py"], None, None),
])
def test_torchrun_runs_through_the_images_own_elasticjob_warm(command, args, routed):
    container = {"command": command, **({"args": args} if args else {})}
    for image in (IMAGE, None):  # the image's kit: whether or not the operator has one to copy
        warm = kit.warm_starts(spec(kit="Image"), container, image)
        assert (warm.command, warm.reason) == (routed, "KitInImage" if routed else "CommandNotTorchrun")


@pytest.mark.parametrize("kit_image", [IMAGE, None])
def test_no_pod_of_the_job_gets_the_kits_init_container(kit_image):
    worker_pod = builders.worker_pod(ref(template=template(args=["--x"])), 0, "10.96.0.1:29400", kit_image=kit_image)
    (container,) = worker_pod["spec"]["containers"]
    assert container["command"] == ["python", *WARM, "train.py", "--x"] and "args" not in container
    assert "initContainers" not in worker_pod["spec"] and "volumes" not in worker_pod["spec"]
    assert "volumeMounts" not in container
    store = builders.rendezvous_pod(ref(), kit_image=kit_image)
    assert store["spec"]["containers"][0]["command"] == ["python", "-m", "elasticjob_store"]
    assert "initContainers" not in store["spec"] and "volumes" not in store["spec"]


def test_the_plan_creates_workers_without_the_kits_init_container_and_says_they_start_warm():
    settings = domain.Settings(kit_image=IMAGE)
    result = planner.plan(job(kit="Image"), observed([rdzv(), worker(0)]), NOW, settings)
    created = [a.manifest for a in result.actions if isinstance(a, planner.CreateObject)
               and a.manifest["kind"] == "Pod"]
    assert created and all("initContainers" not in m["spec"] for m in created)
    warm = next(c for c in result.status.conditions if c.type == "WarmStarts")
    assert (warm.status, warm.reason) == ("True", "KitInImage")


def test_kueues_workload_counts_no_kit_init_container():
    from elasticjob.kueue import workloads as kueue

    assert all("initContainers" not in s["template"]["spec"] for s in kueue.pod_sets(ref(), IMAGE))
