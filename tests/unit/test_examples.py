"""Every ElasticJob under examples/ is one the operator starts as written: the model parses it, the operator's own
checks pass, and extended resources (GPUs) carry limits equal to requests, which the API server requires."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticjob import builders, torchrun
from elasticjob.convert import convert_text
from elasticjob.domain import JobRef
from elasticjob.models import ElasticJobSpec
from elasticjob.planner import lifecycle

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STANDARD = {"cpu", "memory", "ephemeral-storage"}


def jobs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ElasticJob":
                found.append((str(path.relative_to(EXAMPLES)), doc))
    return found


def test_the_examples_include_a_gpu_job() -> None:
    assert "gpu/elasticjob.yaml" in [name for name, _ in jobs()]


@pytest.mark.parametrize("name, doc", jobs(), ids=[name for name, _ in jobs()])
def test_an_example_starts_as_written(name: str, doc: dict[str, Any]) -> None:
    spec = ElasticJobSpec.model_validate(doc["spec"])
    assert lifecycle.validate(JobRef(namespace="default", name=doc["metadata"]["name"], uid="u", spec=spec)) == []
    for container in doc["spec"]["template"]["spec"]["containers"]:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        extended = {key for key in {*requests, *limits} if key not in STANDARD}
        assert {key: requests.get(key) for key in extended} == {key: limits.get(key) for key in extended}, name


def test_the_gpu_example_runs_a_process_per_gpu() -> None:
    (doc,) = [doc for name, doc in jobs() if name == "gpu/elasticjob.yaml"]
    spec = ElasticJobSpec.model_validate(doc["spec"])
    assert torchrun.nproc_per_node(spec, builders.worker_container(spec.template) or {}) == 8


@pytest.mark.parametrize("path", sorted((EXAMPLES / "pytorchjob").glob("*.yaml")), ids=lambda p: p.name)
def test_a_pytorchjob_example_converts(path: Path) -> None:
    """The PyTorchJobs a migrating user starts from (e2e: test_convert_training trains them)."""
    (job,) = [doc for doc in convert_text(path.read_text()).documents if doc.get("kind") == "ElasticJob"]
    spec = ElasticJobSpec.model_validate(job["spec"])
    assert lifecycle.validate(JobRef(namespace="default", name=job["metadata"]["name"], uid="u", spec=spec)) == []


SCRIPT_CONFIGMAP = "train-ddp"


@pytest.mark.parametrize("name, doc", jobs(), ids=[name for name, _ in jobs()])
def test_an_example_runs_a_public_image_with_the_one_script_from_a_configmap(name: str, doc: dict[str, Any]) -> None:
    """Any cluster can run it: PyTorch's public image, and examples/train_ddp.py as a ConfigMap the header says how
    to make (kubectl create configmap ... --from-file), never a copy of the script."""
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("pytorch/pytorch:"), name
    mounts = {v["name"]: v for v in pod["volumes"]}
    script = next(v for v in mounts.values() if (v.get("configMap") or {}).get("name") == SCRIPT_CONFIGMAP)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == script["name"]]
    assert container["command"] == ["torchrun", f"{mount['mountPath']}/train_ddp.py"], name
    header = (EXAMPLES / name).read_text()
    assert f"kubectl create configmap {SCRIPT_CONFIGMAP}" in header and "--from-file=examples/train_ddp.py" in header


@pytest.mark.parametrize("name, doc", [(n, d) for n, d in jobs() if n != "elasticjob.yaml"],
                         ids=[n for n, _ in jobs() if n != "elasticjob.yaml"])
def test_a_gpu_example_is_guaranteed_with_shared_memory_and_the_gpu_taint_tolerated(name: str,
                                                                                     doc: dict[str, Any]) -> None:
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert requests == limits, f"{name}: not Guaranteed, so the kubelet aligns no cores with the GPUs"
    assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"]), name
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or []), name
