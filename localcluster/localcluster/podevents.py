"""Events a kubelet posts about a pod's containers (Unhealthy, Killing), so `kubectl describe pod` shows them."""

from __future__ import annotations

import logging
import secrets

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import podstatus

log = logging.getLogger(__name__)


def post(core: client.CoreV1Api, pod: dict, container: str, node: str, kind: str, reason: str, message: str) -> None:
    meta = pod["metadata"]
    now = podstatus.now()
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                           "uid": meta["uid"], "fieldPath": f"spec.containers{{{container}}}"},
        "reason": reason, "message": message, "type": kind,
        "source": {"component": "kubelet", "host": node},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    try:
        core.create_namespaced_event(meta["namespace"], body, _preload_content=False)
    except ApiException as exc:  # an Event is best effort, as in a kubelet
        log.warning("event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc.reason)
