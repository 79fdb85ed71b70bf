"""Fault injection for the local nodes, as library functions and `python -m localcluster.faults ...`: each fault is
done through the running cluster's kind of node (`nodes`: nodekind.NodeKind, real or process-backed)."""

from __future__ import annotations

import argparse
import os
import signal as signals
import sys
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import kube, processnodes
from .layout import Layout
from .nodekind import NodeKind
from .realnodes.kind import RealNodes

DEFAULT_STATE = Path(".localcluster")


def nodes(state_dir: Path = DEFAULT_STATE) -> NodeKind:
    """The kind of node the local cluster of `state_dir` runs: process-backed while its node agent is recorded
    running (a real node's directory outlives its cluster, so it says nothing), else real, the default (a lost
    real node stays one: its directory is what restores it)."""
    state_dir = Path(state_dir)
    layout = Layout(state_dir.resolve().parent)
    if layout.pid_file("nodeagent").exists():
        return processnodes.ProcessNodes(state_dir)
    return RealNodes(layout)


def kill_pod(namespace: str, name: str, signal: int = signals.SIGKILL, state_dir: Path = DEFAULT_STATE) -> int:
    """Crash a pod's containers; how many were signalled (the node then applies the pod's restartPolicy)."""
    return nodes(state_dir).kill_pod(namespace, name, signal)


def node_loss(node: str, state_dir: Path = DEFAULT_STATE) -> int:
    """A dead kubelet: heartbeats stop, the node's containers die, pod objects are left as they were."""
    return nodes(state_dir).lose_node(node)


def restore_node(node: str, state_dir: Path = DEFAULT_STATE) -> None:
    nodes(state_dir).restore_node(node)


def cordon(core: client.CoreV1Api, node: str, unschedulable: bool = True) -> None:
    core.patch_node(node, {"spec": {"unschedulable": unschedulable}}, _content_type=kube.STRATEGIC,
                    _preload_content=False)


def drain(core: client.CoreV1Api, node: str, timeout: float = 60.0, namespace: str | None = None) -> list[str]:
    """Cordon, then evict every pod on the node (only those of `namespace` if given, so a test leaves other
    tests' pods alone) through the Eviction API: PodDisruptionBudgets apply, a 429 is retried until the deadline.
    Returns the evicted pods as ns/name."""
    cordon(core, node)
    selector = f"spec.nodeName={node}"
    listed = core.list_namespaced_pod(namespace, field_selector=selector, _preload_content=False) if namespace \
        else core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
    pods = kube.as_dict(listed)["items"]
    evicted, deadline = [], time.monotonic() + timeout
    for pod in pods:
        meta = pod["metadata"]
        if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            continue
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=meta["name"], namespace=meta["namespace"]))
        while True:
            try:
                core.create_namespaced_pod_eviction(meta["name"], meta["namespace"], body, _preload_content=False)
                evicted.append(f"{meta['namespace']}/{meta['name']}")
                break
            except ApiException as exc:
                if exc.status == 404:
                    break
                if exc.status != 429 or time.monotonic() > deadline:
                    raise
                time.sleep(1)  # the disruption budget allows no eviction yet; retry as kubectl drain does
    return evicted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ".localcluster/kubeconfig"))
    sub = parser.add_subparsers(dest="cmd", required=True)
    kp = sub.add_parser("kill-pod", help="signal a pod's containers (default SIGKILL)")
    kp.add_argument("pod", help="NS/NAME")
    kp.add_argument("--signal", default="KILL", help="signal name without SIG, or number")
    for name, text in (("node-loss", "stop a node's heartbeats and kill its pods"), ("restore-node", "undo node-loss"),
                       ("drain", "cordon and evict"), ("uncordon", "make schedulable again")):
        sub.add_parser(name, help=text).add_argument("node")
    args = parser.parse_args(argv)
    if args.cmd == "kill-pod":
        ns, _, name = args.pod.partition("/")
        sig = int(args.signal) if args.signal.isdigit() else signals.Signals["SIG" + args.signal.upper()]
        hits = kill_pod(ns, name, sig, args.state_dir)
        print(f"signalled {hits} container(s)")
        return 0 if hits else 1
    if args.cmd == "node-loss":
        print(f"node {args.node} lost; killed {node_loss(args.node, args.state_dir)} container(s)")
    elif args.cmd == "restore-node":
        restore_node(args.node, args.state_dir)
    else:
        core = client.CoreV1Api(kube.api_client(args.kubeconfig))
        if args.cmd == "drain":
            print("\n".join(f"evicted {p}" for p in drain(core, args.node)))
        else:
            cordon(core, args.node, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
