"""Server-side apply of the add-ons' objects (CRDs, RBAC, webhooks, queues) as the cluster admin, with urllib.

`up` runs before any client library is configured, and these are a handful of idempotent writes: one PATCH each
with `application/apply-patch+yaml` (JSON is YAML), field manager `localcluster`, conflicts forced.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from localcluster.health import admin_context, api_json
from localcluster.layout import Endpoints

FIELD_MANAGER = "localcluster"
# kind -> plural, for the kinds `up` applies; namespaced or not follows from metadata.namespace.
PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    "Node": "nodes",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "ServiceAccount": "serviceaccounts",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Service": "services",
    "Deployment": "deployments",
    "APIService": "apiservices",
}


def object_path(obj: dict) -> str:
    group_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
    base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    namespace = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    return f"{base}{namespace}/{PLURALS[kind]}/{meta['name']}"


def apply(endpoints: Endpoints, obj: dict, timeout: float = 60) -> dict:
    """Creates or updates `obj` to match; returns the object as stored."""
    query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
    request = urllib.request.Request(
        f"{endpoints.server}{object_path(obj)}?{query}", data=json.dumps(obj).encode(), method="PATCH",
        headers={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, context=admin_context(endpoints.layout), timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[-800:]
        raise RuntimeError(f"applying {obj['kind']} {obj['metadata']['name']}: HTTP {err.code}: {detail}") from err


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _established(endpoints: Endpoints, name: str) -> bool:
    crd = api_json(endpoints, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def wait_established(endpoints: Endpoints, names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(names)
    while waiting:
        waiting = [name for name in waiting if not _established(endpoints, name)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"CRDs not Established after {timeout:.0f}s: {', '.join(waiting)}")
        time.sleep(0.2)
