"""Real nodes as the fault seam sees them (nodekind.NodeKind): each fault is done to the real parts, as
realnodes/faults.py and node.py say how."""

from __future__ import annotations

from kubernetes import client

from localcluster import kube
from localcluster.layout import Layout
from localcluster.realnodes import faults
from localcluster.realnodes import node as nodes


class RealNodes:
    name = "real"

    def __init__(self, layout: Layout):
        self.layout = layout
        self._core: client.CoreV1Api | None = None

    @property
    def core(self) -> client.CoreV1Api:
        if self._core is None:
            self._core = client.CoreV1Api(kube.api_client(str(self.layout.kubeconfig)))
        return self._core

    def kill_pod(self, namespace: str, name: str, signal: int) -> int:
        return faults.kill_containers(self.core, self.layout.state, namespace, name, signal)

    def lose_node(self, node: str) -> int:
        nodes.lose(self.layout, faults.node_named(self.layout.state, node))
        return 1

    def restore_node(self, node: str) -> None:
        from localcluster import realnodes  # the package imports this module's siblings, not back

        realnodes.restart(self.layout, node)

    def partition(self, namespace: str, name: str) -> int:
        return faults.partition_pod(self.core, self.layout.state, namespace, name)

    def heal(self, namespace: str, name: str) -> int:
        return faults.heal_pod(self.core, self.layout.state, namespace, name)

    def throttle(self, namespace: str, name: str, percent: int | None) -> int:
        return faults.throttle_pod(self.core, self.layout.state, namespace, name, percent)

    def slow_link(self, namespace: str, name: str, rate_mbit: int | None) -> int:
        return faults.slow_link(self.core, self.layout.state, namespace, name, rate_mbit)

    def live_pod_uids(self) -> set[str]:
        from localcluster import realnodes

        return {uid for each in realnodes.existing(self.layout) for uid in nodes.live_pod_uids(each)}
