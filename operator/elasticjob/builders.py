"""Desired Kubernetes objects for a job: worker pods, the rendezvous pod and its Service. Pure."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from elasticjob import naming, torchrun
from elasticjob.models import API_VERSION, KIND, ElasticJobSpec

# A lost node's pods are evicted this long after the node stops answering (Kubernetes' default is 300 s).
NODE_LOST_TOLERATION_SECONDS = 30
RENDEZVOUS_SCRIPT = r'''
import base64, http.server, json, os, pickle, signal, sys, threading
from datetime import timedelta
import torch.distributed as dist
# Blocked before the store's threads start, so that only sigwait below sees them (exit 0, not 143).
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
port = int(os.environ["ELASTICJOB_RDZV_PORT"])
key = "torch.rendezvous." + os.environ["ELASTICJOB_RDZV_RUN_ID"]
# Listens on every address whatever the host; the host is where the store's own client connects.
# multi_tenant: agents of every round share this one store; wait_for_workers=False: agents come and go.
store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                      timeout=timedelta(seconds=int(os.environ.get("ELASTICJOB_RDZV_READ_TIMEOUT", "60"))))
lock = threading.Lock()


def rendezvous_state():
    # torch's c10d backend keeps the rendezvous as base64(pickle(_RendezvousState)) under this key.
    with lock:
        raw = store.get(key) if store.check([key]) else b""
    try:
        state = pickle.loads(base64.b64decode(raw)) if raw else None
    except Exception:  # the backend's "no state yet" sentinel
        state = None
    if state is None:
        return {"round": None}
    return {"round": state.round, "complete": state.complete, "closed": state.closed,
            "nodes": len(state.participants), "waiting": len(state.wait_list)}


class State(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(rendezvous_state()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("", port + 1), State)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"elasticjob rendezvous store listening on port {port}, state on {port + 1}", flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
print("elasticjob rendezvous store stopping", flush=True)
os._exit(0)  # the store's server thread is C++; skip its destructor
'''


@dataclass(frozen=True)
class JobRef:
    """What every owned object needs to know about its job."""

    namespace: str
    name: str
    uid: str
    spec: ElasticJobSpec


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def worker_container_index(template: dict[str, Any]) -> int | None:
    containers = (template.get("spec") or {}).get("containers") or []
    for i, container in enumerate(containers):
        if container.get("name") == naming.WORKER_CONTAINER:
            return i
    return 0 if containers else None


def worker_container(template: dict[str, Any]) -> dict[str, Any] | None:
    index = worker_container_index(template)
    return None if index is None else template["spec"]["containers"][index]


def _node_lost_tolerations(existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = {t.get("key") for t in existing}
    added = [{"key": key, "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": NODE_LOST_TOLERATION_SECONDS}
             for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready") if key not in keys]
    return existing + added


def worker_pod(job: JobRef, index: int, endpoint: str, restart_budget: int, generation: int = 0) -> dict[str, Any]:
    template = copy.deepcopy(job.spec.template)
    meta = template.get("metadata") or {}
    spec = template["spec"]
    container = spec["containers"][worker_container_index(template)]
    # torchrun writes no error file when a worker just exits non-zero, but its last log lines name the
    # worker's exit code (the "Root Cause" block): the log tail becomes the termination message.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    container["env"] = list(container.get("env") or []) + torchrun.agent_env(
        job_name=job.name, run_id=job.uid, spec=job.spec, container=container, endpoint=endpoint,
        restart_budget=restart_budget)
    # The operator replaces failed pods itself and torchrun restarts workers in place; a kubelet restart
    # would hide failures from both.
    spec["restartPolicy"] = "Never"
    spec["tolerations"] = _node_lost_tolerations(list(spec.get("tolerations") or []))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.worker_pod_name(job.name, index),
            "namespace": job.namespace,
            "labels": {**(meta.get("labels") or {}), **naming.worker_labels(job.name, index)},
            "annotations": {**(meta.get("annotations") or {}),
                            naming.RESTART_BUDGET_ANNOTATION: str(restart_budget),
                            naming.RESTART_GENERATION_ANNOTATION: str(generation)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def rendezvous_pod(job: JobRef) -> dict[str, Any]:
    template_spec = job.spec.template.get("spec") or {}
    container = worker_container(job.spec.template) or {}
    port = job.spec.rendezvous.port
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 5,
        "tolerations": _node_lost_tolerations([]),
        "containers": [{
            "name": naming.RENDEZVOUS_CONTAINER,
            "image": job.spec.rendezvous.image or container.get("image", ""),
            "command": ["python", "-c", RENDEZVOUS_SCRIPT],
            "env": [{"name": "ELASTICJOB_RDZV_PORT", "value": str(port)},
                    {"name": "ELASTICJOB_RDZV_RUN_ID", "value": job.uid},
                    {"name": "ELASTICJOB_RDZV_READ_TIMEOUT", "value": str(job.spec.rendezvous.read_timeout_seconds)}],
            "ports": [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"},
                      {"name": "state", "containerPort": port + 1, "protocol": "TCP"}],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        }],
    }
    for key in ("imagePullSecrets", "priorityClassName", "securityContext"):
        if key in template_spec:
            spec[key] = copy.deepcopy(template_spec[key])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": naming.rendezvous_name(job.name), "namespace": job.namespace,
                     "labels": naming.rendezvous_labels(job.name), "ownerReferences": [owner_reference(job)]},
        "spec": spec,
    }


def rendezvous_service(job: JobRef) -> dict[str, Any]:
    port = job.spec.rendezvous.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": naming.rendezvous_name(job.name), "namespace": job.namespace,
                     "labels": naming.job_labels(job.name), "ownerReferences": [owner_reference(job)]},
        "spec": {
            "type": "ClusterIP",
            "selector": naming.rendezvous_labels(job.name),
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"},
                      {"name": "state", "port": port + 1, "targetPort": port + 1, "protocol": "TCP"}],
        },
    }
