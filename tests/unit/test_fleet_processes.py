"""The fleet bench's jobs with processes (bench/fleet_processes.py) are jobs the operator accepts, and only the
torchrun workers go through the kit (its init container and launcher), as a real job's would."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from elasticjob import builders, kit  # noqa: E402
from elasticjob.domain import JobRef  # noqa: E402
from elasticjob.models import ElasticJobSpec  # noqa: E402
from elasticjob.planner.lifecycle import validate  # noqa: E402
from fleet_processes import job_manifest  # noqa: E402


@pytest.mark.parametrize("workers, through_kit", [("sleep", False), ("torch", False), ("torchrun", True)])
def test_the_jobs_are_valid_and_only_torchrun_goes_through_the_kit(workers, through_kit):
    ref = JobRef(namespace="ns", name="j0000", uid="u",
                 spec=ElasticJobSpec.model_validate(job_manifest("j0000", workers)["spec"]))
    assert validate(ref) == []
    pod = builders.worker_pod(ref, 0, "10.0.0.1:29400", kit_image="kit")
    assert any(c["name"] == kit.INIT_CONTAINER for c in pod["spec"].get("initContainers") or []) == through_kit
    store = builders.rendezvous_pod(ref)
    assert store["spec"]["containers"][0]["image"] == pod["spec"]["containers"][0]["image"]  # the real store



@pytest.mark.parametrize("workers", ["sleep", "torchrun"])
def test_with_the_kit_in_the_image_no_pod_gets_an_init_container(workers):
    ref = JobRef(namespace="ns", name="j0000", uid="u",
                 spec=ElasticJobSpec.model_validate(job_manifest("j0000", workers, "Image")["spec"]))
    for pod in (builders.worker_pod(ref, 0, "10.0.0.1:29400", kit_image="kit"),
                builders.rendezvous_pod(ref, kit_image="kit")):
        assert "initContainers" not in pod["spec"]
