"""Cut a pod off the network without killing anything: the partition fault.

The pod's host-side veth leaves the bridge. Frames to and from the pod are then dropped silently in both
directions: no process dies, no TCP reset is sent, the pod's kubelet (the node agent) still sees it running.
Peers see what a partitioned or frozen host looks like: silence. `heal` puts the veth back.
"""

from __future__ import annotations

from pathlib import Path

from . import faults, network, state


def _host_interfaces(namespace: str, name: str, state_dir: Path) -> list[str]:
    found = []
    for _, rec in faults.runtime_records(Path(state_dir)):
        if rec["namespace"] == namespace and rec["name"] == name and rec.get("uid"):
            found.append("v" + state.netns_name(rec["uid"]))
    return [iface for iface in found if network.link_exists(iface)]


def partition(namespace: str, name: str, state_dir: Path = faults.DEFAULT_STATE) -> int:
    """Returns how many pod sandboxes were cut off (0: no such running pod)."""
    if (layout := faults.real_nodes(state_dir)) is not None:
        from localcluster.realnodes import faults as real

        return real.partition_pod(faults.core_api(layout), layout.state, namespace, name)
    interfaces = _host_interfaces(namespace, name, state_dir)
    for iface in interfaces:
        network.sh("ip", "link", "set", iface, "nomaster")
    return len(interfaces)


def heal(namespace: str, name: str, state_dir: Path = faults.DEFAULT_STATE) -> int:
    if (layout := faults.real_nodes(state_dir)) is not None:
        from localcluster.realnodes import faults as real

        return real.heal_pod(faults.core_api(layout), layout.state, namespace, name)
    interfaces = _host_interfaces(namespace, name, state_dir)
    for iface in interfaces:
        network.sh("ip", "link", "set", iface, "master", state.BRIDGE, "up")
    return len(interfaces)
