"""Faults on process-backed nodes (nodeagent.py), done to what the agent runs: the pids its shims recorded are
signalled directly, so a crash happens at once, not on the agent's next tick; a lost node is a marker file in the
state dir (`faults/<node>.lost`) that the agent reads; a pod is cut off by taking its host-side veth off the
bridge (frames then drop silently both ways: no reset, the agent still sees the pod running)."""

from __future__ import annotations

import signal as signals
import time
from pathlib import Path
from typing import Any

from . import launcher, network, state
from .nodekind import Unsupported


def runtime_records(state_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    records = []
    for pod_dir in state.pods_root(state_dir).glob("*"):
        rec = state.read_json(state.runtime_file(pod_dir), None)
        if rec:
            records.append((pod_dir, rec))
    return records


def signal_pod_dir(pod_dir: Path, rec: dict[str, Any], sig: int) -> int:
    names = (rec.get("initContainers") or []) + (rec.get("containers") or [])
    return sum(launcher.signal_container(state.pid_file(pod_dir, n), sig) for n in names)


def is_lost(node: str, state_dir: Path) -> bool:
    return state.lost_marker(Path(state_dir), node).exists()


class ProcessNodes:
    name = "process"

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)

    def _records(self, namespace: str, name: str) -> list[tuple[Path, dict[str, Any]]]:
        return [(pod_dir, rec) for pod_dir, rec in runtime_records(self.state_dir)
                if rec["namespace"] == namespace and rec["name"] == name]

    def kill_pod(self, namespace: str, name: str, signal: int) -> int:
        # Each container's PID 1 is signalled; a SIGKILL takes its whole PID namespace with it. The agent then
        # applies the pod's restartPolicy.
        return sum(signal_pod_dir(pod_dir, rec, signal) for pod_dir, rec in self._records(namespace, name))

    def lose_node(self, node: str) -> int:
        marker = state.lost_marker(self.state_dir, node)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{time.time()}\n")  # written first, so the agent reports none of the deaths below
        return sum(signal_pod_dir(d, rec, signals.SIGKILL)
                   for d, rec in runtime_records(self.state_dir) if rec.get("node") == node)

    def restore_node(self, node: str) -> None:
        state.lost_marker(self.state_dir, node).unlink(missing_ok=True)

    def _veths(self, namespace: str, name: str) -> list[str]:
        found = ["v" + state.netns_name(rec["uid"]) for _, rec in self._records(namespace, name) if rec.get("uid")]
        return [iface for iface in found if network.link_exists(iface)]

    def partition(self, namespace: str, name: str) -> int:
        interfaces = self._veths(namespace, name)
        for iface in interfaces:
            network.sh("ip", "link", "set", iface, "nomaster")
        return len(interfaces)

    def heal(self, namespace: str, name: str) -> int:
        interfaces = self._veths(namespace, name)
        for iface in interfaces:
            network.sh("ip", "link", "set", iface, "master", state.BRIDGE, "up")
        return len(interfaces)

    def throttle(self, namespace: str, name: str, percent: int | None) -> int:
        raise Unsupported("throttling a pod needs the local cluster's real nodes (their cgroups); "
                          "start it without --process-nodes")

    def slow_link(self, namespace: str, name: str, rate_mbit: int | None) -> int:
        raise Unsupported("a slow link needs the local cluster's real nodes (a pod's own network namespace and "
                          "tc); start it without --process-nodes")

    def live_pod_uids(self) -> set[str]:
        return {rec["uid"] for pod_dir, rec in runtime_records(self.state_dir)
                if any(launcher.signal_container(state.pid_file(pod_dir, n), 0) for n in rec.get("containers") or [])}
