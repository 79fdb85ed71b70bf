"""The examples' training script as the ConfigMap they mount (`train-ddp`), made from examples/train_ddp.py as a user
makes it with `kubectl create configmap train-ddp --from-file=examples/train_ddp.py`: one script, never a copy."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_ddp.py"
NAME = "train-ddp"


def configmap(namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": namespace},
            "data": {SCRIPT.name: SCRIPT.read_text()}}


def apply(api: client.ApiClient, namespace: str) -> None:
    """Created, or replaced with the script as it is now (a ConfigMap left by an earlier run may be stale)."""
    core = client.CoreV1Api(api)
    body = configmap(namespace)
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
        core.replace_namespaced_config_map(NAME, namespace, body)
