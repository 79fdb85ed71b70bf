"""Pod networking on one host: a bridge, one network namespace + veth per pod, and ClusterIPs on `lo`.

Pods reach the host (and ClusterIPs, which live on the host's `lo`) through their default route via the bridge, and
each other over the bridge itself, so no IP forwarding or NAT is involved.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
import threading
from pathlib import Path

from . import state

log = logging.getLogger(__name__)


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip()}")
    return result


def link_exists(name: str) -> bool:
    return sh("ip", "link", "show", name, check=False).returncode == 0


def ensure_bridge() -> None:
    if not link_exists(state.BRIDGE):
        sh("ip", "link", "add", state.BRIDGE, "type", "bridge")
    cidr = f"{state.BRIDGE_IP}/{state.POD_CIDR_PREFIX}"
    if cidr not in sh("ip", "-o", "addr", "show", "dev", state.BRIDGE).stdout:
        sh("ip", "addr", "add", cidr, "dev", state.BRIDGE)
    sh("ip", "link", "set", state.BRIDGE, "up")
    accept_forwarding(state.BRIDGE)


def forward_rules(bridge: str) -> list[tuple[str, ...]]:
    """iptables FORWARD rules that accept the bridge's traffic: the nodes' packets cross the host's FORWARD chain
    (br_netfilter, which kube-proxy needs), whose policy Docker sets to DROP when it starts (kind's engine)."""
    return [("FORWARD", "-i", bridge, "-j", "ACCEPT"), ("FORWARD", "-o", bridge, "-j", "ACCEPT")]


def accept_forwarding(bridge: str) -> None:
    """Inserts forward_rules where missing (iptables -C first, so that a second `up` adds no duplicate)."""
    for rule in forward_rules(bridge):
        if sh("iptables", "-C", *rule, check=False).returncode != 0:
            sh("iptables", "-I", *rule)


class Ipam:
    """Pod IPs from 10.244.0.0/16, one per pod uid, persisted so an agent restart never hands out a live address."""

    def __init__(self, state_dir: Path):
        self.path = state.ipam_file(state_dir)
        self.lock = threading.Lock()
        self.network = ipaddress.ip_network(f"{state.BRIDGE_IP}/{state.POD_CIDR_PREFIX}", strict=False)

    def allocate(self, uid: str) -> str:
        with self.lock:
            table: dict[str, str] = state.read_json(self.path, {})
            for ip, owner in table.items():
                if owner == uid:
                    return ip
            reserved = {str(self.network.network_address), state.BRIDGE_IP, str(self.network.broadcast_address)}
            for host in self.network.hosts():
                ip = str(host)
                if ip not in table and ip not in reserved:
                    table[ip] = uid
                    state.write_json(self.path, table)
                    return ip
        raise RuntimeError("pod CIDR exhausted")

    def release(self, uid: str) -> None:
        with self.lock:
            table = state.read_json(self.path, {})
            kept = {ip: owner for ip, owner in table.items() if owner != uid}
            if kept != table:
                state.write_json(self.path, kept)

    def keep_only(self, live_uids: set[str]) -> None:
        with self.lock:
            table = state.read_json(self.path, {})
            state.write_json(self.path, {ip: owner for ip, owner in table.items() if owner in live_uids})


def create_netns(uid: str, ip: str) -> str:
    """A pod sandbox: netns with `lo` up and eth0 on the bridge, default route via the bridge."""
    ns = state.netns_name(uid)
    delete_netns(ns)
    host_if = "v" + ns
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    sh("ip", "link", "set", host_if, "master", state.BRIDGE, "up")
    sh("ip", "-n", ns, "addr", "add", f"{ip}/{state.POD_CIDR_PREFIX}", "dev", "eth0")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "link", "set", "eth0", "up")
    sh("ip", "-n", ns, "route", "add", "default", "via", state.BRIDGE_IP)
    return ns


def delete_netns(ns: str) -> None:
    # Deleting the netns destroys its veth end, and with it the host end.
    sh("ip", "netns", "del", ns, check=False)
    if link_exists("v" + ns):
        sh("ip", "link", "del", "v" + ns, check=False)


def list_netns() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(state.NETNS_PREFIX)]


class LoopbackIps:
    """ClusterIPs added to `lo`, recorded so cleanup removes exactly what the agent added."""

    def __init__(self, state_dir: Path):
        self.path = state.cluster_ips_file(state_dir)
        self.lock = threading.Lock()

    def add(self, ip: str) -> None:
        with self.lock:
            ips = set(state.read_json(self.path, []))
            sh("ip", "addr", "replace", f"{ip}/32", "dev", "lo")
            ips.add(ip)
            state.write_json(self.path, sorted(ips))

    def remove(self, ip: str) -> None:
        with self.lock:
            ips = set(state.read_json(self.path, []))
            sh("ip", "addr", "del", f"{ip}/32", "dev", "lo", check=False)
            ips.discard(ip)
            state.write_json(self.path, sorted(ips))

    def remove_all(self) -> None:
        for ip in state.read_json(self.path, []):
            self.remove(ip)


def teardown_all(state_dir: Path) -> None:
    for ns in list_netns():
        delete_netns(ns)
    if link_exists(state.BRIDGE):
        sh("ip", "link", "del", state.BRIDGE, check=False)
    for rule in forward_rules(state.BRIDGE):
        sh("iptables", "-D", *rule, check=False)
    LoopbackIps(state_dir).remove_all()
    Path(state.ipam_file(state_dir)).unlink(missing_ok=True)
