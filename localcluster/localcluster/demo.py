"""`make run`: the operator doing its main job on the local cluster, followed until the job finishes.

Starts the local cluster if none runs, installs the CRD, runs the operator (`python -m elasticjob run`, the
entry the image starts), applies examples/elasticjob.yaml and prints the job's progress: phase, workers,
restarts, the training step and world size the workers report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from . import controlplane

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elasticjob.yaml"
CRD = ROOT / "crds" / "elasticjob.dev_elasticjobs.yaml"
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
NAMESPACE = "default"
TIMEOUT_SECONDS = 900


def install_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    doc = yaml.safe_load(CRD.read_text())
    ext.patch_custom_resource_definition(doc["metadata"]["name"], doc, field_manager="elasticjob-demo",
                                         force=True, _content_type="application/apply-patch+yaml")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return
        time.sleep(0.5)
    raise SystemExit("the ElasticJob CRD did not become Established within 30s")


def start_operator(kubeconfig: Path) -> subprocess.Popen:
    log = ROOT / ".localcluster" / "logs" / "operator.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"operator: python -m elasticjob run --namespace {NAMESPACE} (log: {log.relative_to(ROOT)})")
    return subprocess.Popen([sys.executable, "-m", "elasticjob", "run", "--namespace", NAMESPACE],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "KUBECONFIG": str(kubeconfig)}, start_new_session=True)


def submit(custom: client.CustomObjectsApi, job: dict) -> None:
    name = job["metadata"]["name"]
    try:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        print(f"deleted the previous {name}")
        wait_gone(custom, name)
    except ApiException as err:
        if err.status != 404:
            raise
    checkpoints = job["spec"].get("checkpointDir")
    if checkpoints:
        # Start the demo from step 0, not from the last run's checkpoint.
        shutil.rmtree(Path(checkpoints).parent, ignore_errors=True)
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, job)
    print(f"applied {EXAMPLE.relative_to(ROOT)}: ElasticJob {name}")


def wait_gone(custom: client.CustomObjectsApi, name: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        time.sleep(0.5)
    raise SystemExit(f"the previous {name} is still there after 60s")


def training_progress(checkpoint_dir: str | None) -> str:
    if not checkpoint_dir:
        return ""
    progress = Path(checkpoint_dir) / "progress.jsonl"
    try:
        last = json.loads(progress.read_text().splitlines()[-1])
    except (OSError, IndexError, ValueError):
        return ""
    return f" | step {last.get('step')} at world size {last.get('world_size')}"


def follow(custom: client.CustomObjectsApi, job: dict, operator: subprocess.Popen) -> str:
    name = job["metadata"]["name"]
    shown, deadline = "", time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if operator.poll() is not None:
            raise SystemExit(f"the operator exited with {operator.returncode}; see .localcluster/logs/operator.log")
        status = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name).get("status") or {}
        line = (f"{status.get('phase', 'Pending'):<10} ready {status.get('readyReplicas', 0)}/"
                f"{status.get('desiredReplicas', '?')}  restarts {status.get('restarts', 0)}  "
                f"{status.get('message') or ''}{training_progress(job['spec'].get('checkpointDir'))}")
        if line != shown:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)
            shown = line
        if status.get("phase") in ("Succeeded", "Failed"):
            return status["phase"]
        time.sleep(1)
    raise SystemExit(f"{name} did not finish within {TIMEOUT_SECONDS}s")


def stop(operator: subprocess.Popen) -> None:
    if operator.poll() is None:
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(operator.pid, signal.SIGKILL)


def main() -> int:
    cluster = controlplane.ensure_up(ROOT, 3)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    install_crd(api)
    custom = client.CustomObjectsApi(api)
    job = yaml.safe_load(EXAMPLE.read_text())
    operator = start_operator(cluster.kubeconfig)
    try:
        submit(custom, job)
        phase = follow(custom, job, operator)
    finally:
        stop(operator)
    print(f"\n{job['metadata']['name']} {phase}. The cluster keeps running: "
          f"`export KUBECONFIG={cluster.kubeconfig}` and `kubectl get ej`; `make cluster-down` stops it.")
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
