"""Faults on real nodes, done to the real parts:

- a container's main process is signalled through its node's containerd (`ctr tasks kill`), as the kernel's OOM
  killer or a crash would end it; the kubelet sees the exit and applies the pod's restartPolicy;
- a pod is cut off the network by DROP rules in its node's FORWARD chain (the bridge's traffic passes it):
  its processes live on, silent, and the kubelet still sees it running;
- a node is lost (node.lose) or cut off as a whole (netns.partition).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kubernetes import client

from localcluster.realnodes import netns
from localcluster.realnodes.plan import RealNode

RULE_COMMENT = "localcluster-partition"


def _node(state: Path, name: str) -> RealNode:
    return RealNode(int(name.rsplit("-", 1)[1]), name, state)


def kill_containers(core: client.CoreV1Api, state: Path, namespace: str, name: str, signal: int) -> int:
    """Signals the main process of each running container of the pod; returns how many were signalled."""
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.spec.node_name:
        return 0
    node = _node(state, pod.spec.node_name)
    hits = 0
    for status in (pod.status.container_statuses or []):
        if status.state.running is None or not status.container_id:
            continue
        container = status.container_id.split("://", 1)[1]
        result = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "tasks", "kill",
                                 "--signal", str(int(signal)), container], capture_output=True, text=True)
        hits += result.returncode == 0
    return hits


def _pod_ip_and_node(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> tuple[str, RealNode] | None:
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.status.pod_ip or not pod.spec.node_name:
        return None
    return pod.status.pod_ip, _node(state, pod.spec.node_name)


def _forward_rules(node: RealNode, ip: str, action: str) -> None:
    for match in ("-s", "-d"):
        subprocess.run(["nsenter", f"--net=/run/netns/{node.netns}", "--", "iptables", action, "FORWARD", match, ip,
                        "-m", "comment", "--comment", RULE_COMMENT, "-j", "DROP"], capture_output=True, check=False)


def partition_pod(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> int:
    found = _pod_ip_and_node(core, state, namespace, name)
    if found is None:
        return 0
    _forward_rules(found[1], found[0], "-I")
    return 1


def heal_pod(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> int:
    found = _pod_ip_and_node(core, state, namespace, name)
    if found is None:
        return 0
    _forward_rules(found[1], found[0], "-D")
    return 1


def partition_node(state: Path, name: str) -> None:
    netns.partition(_node(state, name))


def heal_node(state: Path, name: str) -> None:
    netns.heal(_node(state, name))
