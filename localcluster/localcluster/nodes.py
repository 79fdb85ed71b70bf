"""Node objects and their heartbeats: a Ready condition kept fresh and a Lease in kube-node-lease renewed every 5 s."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import kube, kubeletapi, podstatus

log = logging.getLogger(__name__)
LEASE_SECONDS = 40
RENEW_EVERY = 5.0
STATUS_EVERY = 10.0
NODE_PREFIX = "local-node-"


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(count)]


def capacity(cpu: str, memory: str, gpus: int) -> dict[str, str]:
    cap = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}
    if gpus > 0:
        cap["nvidia.com/gpu"] = str(gpus)
    return cap


def node_body(name: str, cap: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "localcluster"}},
        "spec": {},
    }


def ready_conditions(ready: bool) -> list[dict]:
    stamp = podstatus.now()
    conds = [{"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": m,
              "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
             for t, r, m in (("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                             ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                             ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"))]
    conds.append({"type": "Ready", "status": "True" if ready else "False",
                  "reason": "KubeletReady" if ready else "KubeletNotReady",
                  "message": "local node agent is posting ready status", "lastHeartbeatTime": stamp,
                  "lastTransitionTime": stamp})
    return conds


def status_body(name: str, cap: dict[str, str], host_ip: str, previous: dict | None, version: str) -> dict:
    """The node's status; its kubelet port is 10250 + its index, since all local nodes share one IP. `version`:
    the control plane's, which a kubelet of the same build would report."""
    conds = ready_conditions(True)
    old = {c["type"]: c for c in ((previous or {}).get("status") or {}).get("conditions") or []}
    for cond in conds:
        prev = old.get(cond["type"])
        if prev and prev.get("status") == cond["status"]:
            cond["lastTransitionTime"] = prev["lastTransitionTime"]
    return {"status": {
        "capacity": cap, "allocatable": cap, "conditions": conds,
        "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubeletapi.node_port(int(name.rsplit("-", 1)[1]))}},
        "nodeInfo": {"machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": "local",
                     "osImage": socket.gethostname(), "containerRuntimeVersion": "localcluster://0",
                     "kubeletVersion": version, "kubeProxyVersion": version, "operatingSystem": "linux",
                     "architecture": "amd64"},
    }}


class Heartbeats(threading.Thread):
    """Registers the nodes, then renews every node's Lease and status unless the node is marked lost."""

    def __init__(self, api: client.ApiClient, names: list[str], cap: dict, host_ip: str,
                 is_lost: Callable[[str], bool], stop: threading.Event):
        super().__init__(name="heartbeats", daemon=True)
        self.core, self.coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.names, self.cap, self.host_ip, self.is_lost, self.stop = names, cap, host_ip, is_lost, stop
        self.last_status: dict[str, float] = {}
        self.version = client.VersionApi(api).get_code().git_version

    def register(self) -> None:
        for name in self.names:
            try:
                self.core.create_node(node_body(name, self.cap), _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            self.post_status(name)
            self.renew_lease(name)

    def post_status(self, name: str) -> None:
        previous = kube.get_or_none(self.core.read_node, name)
        self.core.patch_node_status(name, status_body(name, self.cap, self.host_ip, previous, self.version),
                                    _content_type=kube.STRATEGIC, _preload_content=False)
        self.last_status[name] = time.monotonic()

    def renew_lease(self, name: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {"metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}}
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", body, _content_type=kube.STRATEGIC,
                                              _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", body, _preload_content=False)

    def run(self) -> None:
        while not self.stop.is_set():
            for name in self.names:
                if self.is_lost(name):
                    self.last_status.pop(name, None)  # post a fresh status the moment it comes back
                    continue
                try:
                    self.renew_lease(name)
                    if time.monotonic() - self.last_status.get(name, 0) >= STATUS_EVERY:
                        self.post_status(name)
                except Exception as exc:  # noqa: BLE001 - keep beating through apiserver hiccups
                    log.warning("heartbeat %s: %s", name, exc)
            self.stop.wait(RENEW_EVERY)
