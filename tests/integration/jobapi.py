"""ElasticJobs and their pods through the real API server: what the integration tests create and wait on."""

from __future__ import annotations

from pathlib import Path

from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
SLEEP = ["python", "-c", "import time; time.sleep(3600)"]


def job_manifest(name: str, command=SLEEP, **spec) -> dict:
    container = {"name": "worker", "image": "trainer:test", "command": command,
                 "resources": spec.pop("resources", {"requests": {"cpu": "100m"}})}
    body = {"minReplicas": 1, "maxReplicas": 3, "replicas": 2, "maxRestarts": 2,
            "template": {"spec": {"terminationGracePeriodSeconds": 3, "containers": [container]}}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {**body, **spec}}


def create(api, namespace, manifest):
    return api[0].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


def get_job(api, namespace, name):
    return api[0].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def pods(api, namespace, role="worker"):
    found = api[1].list_namespaced_pod(namespace, label_selector=f"elasticjob.dev/role={role}").items
    return sorted((p for p in found if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.name)


def status_of(api, namespace, name):
    return get_job(api, namespace, name).get("status") or {}


def wait_phase(api, namespace, name, phase, timeout=60, reason=None):
    def matches(status):
        return status.get("phase") == phase and (reason is None or status.get("reason") == reason)
    return wait_for(lambda: status_of(api, namespace, name), timeout, f"{name} in phase {phase}/{reason}",
                    until=matches)


def wait_pods(api, namespace, count, timeout=60, running=True):
    def ok(found):
        live = [p for p in found if not running or p.status.phase == "Running"]
        return len(live) == count and len(found) == count
    return wait_for(lambda: pods(api, namespace), timeout, f"{count} worker pods", until=ok)
