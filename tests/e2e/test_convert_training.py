"""`elasticjob convert` on the PyTorchJobs of examples/pytorchjob/ (written from Kubeflow's docs), then trained.

Each PyTorchJob is converted by the CLI as a user runs it, created as it comes out (only the namespace given),
(and the worker image as this cluster names it), and must train to `Succeeded` at the world size the PyTorchJob had: a Master and 2 Workers with `python3`
become 3 torchrun workers; an elastic job keeps its 2 workers and its restart budget.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e_support import GROUP, PLURAL, VERSION, WORKER_IMAGE, exit_codes

ROOT = Path(__file__).resolve().parents[2]
FINISH_TIMEOUT = 180


def converted(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "elasticjob", "convert", str(path)], capture_output=True, text=True,
                         check=True, timeout=60)
    (job,) = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    return job


# ddp.yaml in make e2e only: elastic.yaml (in make test) goes through the same converter and training.
@pytest.mark.parametrize(("example", "workers"), [pytest.param("ddp.yaml", 3, marks=pytest.mark.slow),
                                                  ("elastic.yaml", 2)])
def test_a_converted_pytorchjob_trains_to_success(operator, jobs, example, workers):
    job = converted(ROOT / "examples" / "pytorchjob" / example)
    name = job["metadata"]["name"]
    job["metadata"]["namespace"] = jobs.namespace
    # The worker image as this cluster names it (the examples name it as `make images` tags it).
    job["spec"]["template"]["spec"]["containers"][0]["image"] = WORKER_IMAGE
    assert job["apiVersion"] == f"{GROUP}/{VERSION}"
    jobs.custom.create_namespaced_custom_object(GROUP, VERSION, jobs.namespace, PLURAL, job)
    status = jobs.wait_phase("Succeeded", FINISH_TIMEOUT, name=name)
    pods = jobs.worker_pods(name)
    assert len(pods) == workers and set(exit_codes(pods).values()) == {0}, jobs.pods_summary(name)
    assert status.get("restarts") == 0, status
