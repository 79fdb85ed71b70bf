"""The local cluster's two kinds of node behind one seam: the faults done to their pods and nodes, and which pods
really run on them.

Real nodes (realnodes/: kubelet, containerd, runc) are the default, and what `make test`, `make run` and the
benchmarks use; process-backed nodes (nodeagent.py: each pod's containers as process trees) are left to their own
tests and two benchmarks' light pods (docs/development.md has the timing of the integration tier on both).
A caller asks `faults.nodes(state_dir)` for the running cluster's kind and does its fault through it; nothing outside
this module and the two kinds branches on which kind runs.
"""

from __future__ import annotations

from typing import Protocol


class Unsupported(RuntimeError):
    """A fault this kind of node cannot do (a process-backed node has no cgroups, no containerd, no link of its own
    to slow)."""


class NodeKind(Protocol):
    name: str  # "real" or "process", as LOCALCLUSTER_NODE_KIND names them

    def kill_pod(self, namespace: str, name: str, signal: int) -> int:
        """Signals each running container of the pod, as a crash or the OOM killer ends it; how many."""

    def lose_node(self, node: str) -> int:
        """The node is gone at once (heartbeats stop, its containers die, pod objects stay); containers killed."""

    def restore_node(self, node: str) -> None:
        """Undoes lose_node: the node's processes start again with what its disk kept."""

    def partition(self, namespace: str, name: str) -> int:
        """Cuts the pod off the network, silently (no process dies, no reset is sent); 0: no such running pod."""

    def heal(self, namespace: str, name: str) -> int:
        """Undoes partition."""

    def throttle(self, namespace: str, name: str, percent: int | None) -> int:
        """Caps each running container of the pod at `percent` of one CPU (None lifts it); how many."""

    def slow_link(self, namespace: str, name: str, rate_mbit: int | None) -> int:
        """What the pod sends goes at `rate_mbit` at most (None lifts it); 1 once the pod runs, else 0."""

    def live_pod_uids(self) -> set[str]:
        """The uids of the pods whose processes really run now, whatever the API says."""
