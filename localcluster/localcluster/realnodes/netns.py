"""A real node's network: its namespace, its veth on the cluster's bridge, and routes to every node's pods.

The host routes each node's pod /24 to that node's address, so that this host (tests, `kubectl port-forward`'s
peer, the benchmarks) reaches pod IPs; nodes route to each other directly over the bridge. A partition takes the
node's end of its veth down: its pods and its kubelet lose the cluster at once, as a cut cable does.
"""

from __future__ import annotations

from localcluster import network
from localcluster.realnodes.plan import RealNode, node_cidr, routes
from localcluster.state import BRIDGE, BRIDGE_IP

sh = network.sh


def exists(node: RealNode) -> bool:
    return node.netns in sh("ip", "netns", "list", check=False).stdout.split()


def create(node: RealNode, everyone: list[RealNode]) -> None:
    network.ensure_bridge()
    sh("sysctl", "-qw", "net.ipv4.ip_forward=1")
    delete(node)
    sh("ip", "netns", "add", node.netns)
    sh("ip", "link", "add", node.host_link, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
    sh("ip", "link", "set", node.host_link, "master", BRIDGE, "up")
    inside = ("ip", "-n", node.netns)
    sh(*inside, "addr", "add", node_cidr(node), "dev", "eth0")
    sh(*inside, "link", "set", "lo", "up")
    sh(*inside, "link", "set", "eth0", "up")
    sh(*inside, "route", "add", "default", "via", BRIDGE_IP)
    for destination, via in routes(node, everyone):
        sh(*inside, "route", "replace", destination, "via", via)
    in_ns = ("ip", "netns", "exec", node.netns, "sysctl", "-qw")
    sh(*in_ns, "net.ipv4.ip_forward=1")
    # kube-proxy's rules must see traffic between two pods of one bridge (a pod reaching a Service whose
    # endpoint sits on the same node), as on any kubeadm node.
    sh(*in_ns, "net.bridge.bridge-nf-call-iptables=1", check=False)
    sh("ip", "route", "replace", node.pod_subnet, "via", node.ip)


def delete(node: RealNode) -> None:
    sh("ip", "route", "del", node.pod_subnet, check=False)
    sh("ip", "netns", "del", node.netns, check=False)
    if network.link_exists(node.host_link):
        sh("ip", "link", "del", node.host_link, check=False)


def partition(node: RealNode) -> None:
    sh("ip", "link", "set", node.host_link, "down")


def heal(node: RealNode) -> None:
    sh("ip", "link", "set", node.host_link, "up")
