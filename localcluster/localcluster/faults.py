"""Fault injection for the local nodes, as library functions and `python -m localcluster.faults ...`.

The running agent is told through marker files in the state dir (`faults/<node>.lost`); processes are signalled
directly by the pids the shims recorded, so a crash happens at once, not on the agent's next tick.
"""

from __future__ import annotations

import argparse
import os
import signal as signals
import sys
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import kube, launcher, state
from .layout import Layout

DEFAULT_STATE = Path(".localcluster")


def runtime_records(state_dir: Path) -> list[tuple[Path, dict]]:
    records = []
    for pod_dir in state.pods_root(state_dir).glob("*"):
        rec = state.read_json(state.runtime_file(pod_dir), None)
        if rec:
            records.append((pod_dir, rec))
    return records


def signal_pod_dir(pod_dir: Path, rec: dict, sig: int) -> int:
    names = (rec.get("initContainers") or []) + (rec.get("containers") or [])
    return sum(launcher.signal_container(state.pid_file(pod_dir, n), sig) for n in names)


def kill_pod(namespace: str, name: str, signal: int = signals.SIGKILL, state_dir: Path = DEFAULT_STATE) -> int:
    """Crash a pod's containers: signal each container's PID 1 (SIGKILL takes its whole PID namespace with it).
    Returns how many containers were signalled; the agent then applies the pod's restartPolicy."""
    if (layout := real_nodes(state_dir)) is not None:
        from localcluster.realnodes import faults as real

        return real.kill_containers(core_api(layout), layout.state, namespace, name, signal)
    hits = 0
    for pod_dir, rec in runtime_records(Path(state_dir)):
        if rec["namespace"] == namespace and rec["name"] == name:
            hits += signal_pod_dir(pod_dir, rec, signal)
    return hits


def node_loss(node: str, state_dir: Path = DEFAULT_STATE) -> int:
    """A dead kubelet: heartbeats stop, the node's containers die, pod objects are left as they were."""
    if (layout := real_nodes(state_dir)) is not None:
        from localcluster.realnodes import node as real_node

        real_node.lose(layout, _real_node(layout, node))
        return 1
    marker = state.lost_marker(Path(state_dir), node)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{time.time()}\n")  # written first, so the agent reports none of the deaths below
    return sum(signal_pod_dir(d, rec, signals.SIGKILL)
               for d, rec in runtime_records(Path(state_dir)) if rec.get("node") == node)


def restore_node(node: str, state_dir: Path = DEFAULT_STATE) -> None:
    """Undoes node_loss. A process-backed node was lost by its marker; a real node's directory alone says nothing
    (it outlives a real-node cluster, and a process-backed one started after it would get a real kubelet back)."""
    marker = state.lost_marker(Path(state_dir), node)
    layout = Layout(Path(state_dir).resolve().parent)
    if not marker.exists() and _real_node(layout, node).dir.is_dir():
        from localcluster import realnodes

        realnodes.restart(layout, node)
        return
    marker.unlink(missing_ok=True)


def real_nodes(state_dir: Path) -> Layout | None:
    """The cluster's layout when its nodes are real ones (realnodes/), else None (the node agent's)."""
    from localcluster import realnodes

    layout = Layout(Path(state_dir).resolve().parent)
    return layout if realnodes.running(layout) else None


def _real_node(layout: Layout, name: str):  # -> realnodes.plan.RealNode
    from localcluster.realnodes.plan import RealNode

    return RealNode(int(name.rsplit("-", 1)[1]), name, layout.state)


def core_api(layout: Layout) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client(str(layout.kubeconfig)))


def is_lost(node: str, state_dir: Path) -> bool:
    return state.lost_marker(Path(state_dir), node).exists()


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
