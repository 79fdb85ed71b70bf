"""What one real node is made of, as data: its addresses, its directories and the configuration files of its
containerd, CNI, kubelet and kube-proxy. Pure: node.py writes these files and starts the processes.

A node is a network namespace on the local cluster's bridge (`ej0`, where the API server listens). Inside it:
its own containerd (with runc), the CNI bridge its pods hang on, the kubelet and kube-proxy. Each node's pods get
a /24 of their own; every node, and the host, routes the other nodes' /24s to that node's address.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tomli_w
import yaml

from localcluster.state import BRIDGE_IP, POD_CIDR_PREFIX

POD_CIDR = "10.245.0.0/16"  # every real node's pods; node i has 10.245.i.0/24
CLUSTER_DNS = "10.96.0.10"  # the kube-dns Service's ClusterIP (systemapps.py)
CLUSTER_DOMAIN = "cluster.local"
NETNS_PREFIX = "ejnode-"
# Built here (cmd/pause) and imported into every node: the cluster's own parts (pause, CoreDNS, metrics-server)
# are imported; the project's images are pulled from the local registry (registry.py, hosts_toml).
PAUSE_IMAGE = "localcluster.local/pause:1"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
# A lost node is seen in seconds (the control plane's node-monitor-grace-period is 20 s).
NODE_STATUS_UPDATE = "4s"


@dataclass(frozen=True)
class RealNode:
    """Node `index` of a cluster whose state lives in `state` (the layout's state directory)."""

    index: int
    name: str
    state: Path

    @property
    def ip(self) -> str:
        return f"10.244.254.{10 + self.index}"

    @property
    def pod_subnet(self) -> str:
        return f"10.245.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.245.{self.index}.1"

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def host_link(self) -> str:
        """The host end of the node's veth, on the bridge."""
        return f"ejn{self.index}"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's cgroupRoot, in every hierarchy: all of the node's pods live under it."""
        return f"/ejnode-{self.index}"

    @property
    def dir(self) -> Path:
        return self.state / "nodes" / self.name

    @property
    def socket(self) -> Path:
        return self.dir / "run" / "containerd.sock"

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)


def nodes(state: Path, names: list[str]) -> list[RealNode]:
    return [RealNode(i, name, state) for i, name in enumerate(names)]


def routes(node: RealNode, others: list[RealNode]) -> list[tuple[str, str]]:
    """(destination, via) for the other nodes' pods, inside `node`'s namespace."""
    return [(other.pod_subnet, other.ip) for other in others if other.index != node.index]


def node_cidr(node: RealNode) -> str:
    """The node's address on the bridge, with the bridge's prefix."""
    return f"{node.ip}/{POD_CIDR_PREFIX}"


def containerd_config(node: RealNode) -> str:
    """containerd 1.6 (config version 2): every path under the node's directory, so that nodes share nothing."""
    cri = {
        "sandbox_image": PAUSE_IMAGE,
        "disable_apparmor": True,
        # This machine refuses to lower oom_score_adj: a container may not go below containerd's own.
        "restrict_oom_score_adj": True,
        "netns_mounts_under_state_dir": True,
        "containerd": {
            "snapshotter": "overlayfs",
            "default_runtime_name": "runc",
            "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2",
                                  "options": {"SystemdCgroup": False}}},
        },
        "cni": {"bin_dir": CNI_BIN_DIR, "conf_dir": str(node.path("cni"))},
        # One folder per registry host (containerd's hosts.toml), the local registry's among them.
        "registry": {"config_path": str(node.path("certs.d"))},
    }
    config = {
        "version": 2,
        "root": str(node.path("containerd")),
        "state": str(node.path("run", "containerd")),
        "grpc": {"address": str(node.socket)},
        "ttrpc": {"address": str(node.path("run", "containerd.sock.ttrpc"))},
        "plugins": {
            "io.containerd.grpc.v1.cri": cri,
            "io.containerd.internal.v1.opt": {"path": str(node.path("opt"))},
        },
    }
    return tomli_w.dumps(config)


def hosts_toml(address: str, ca: Path) -> str:
    """containerd's hosts.toml for a registry served over TLS by a certificate of the cluster's CA."""
    return tomli_w.dumps({"server": f"https://{address}",
                          "host": {f"https://{address}": {"capabilities": ["pull", "resolve"], "ca": str(ca)}}})


def cni_config(node: RealNode) -> str:
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "localcluster",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_subnet, "gateway": node.pod_gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(node.path("cni-ipam"))}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2)


def kubelet_config(node: RealNode, pki: Path) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine has cgroup v1 only: upstream's default now refuses to start on it.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": node.ip,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(pki / f"kubelet-{node.name}.crt"),
        "tlsPrivateKeyFile": str(pki / f"kubelet-{node.name}.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(node.path("resolv.conf")),
        "podLogsDir": str(node.path("pod-logs")),
        "failSwapOn": False,
        # Several kubelets share one disk, which is fuller than a fresh node's: no evictions, no image GC.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": NODE_STATUS_UPDATE,
        "localStorageCapacityIsolation": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(node: RealNode, kubeconfig: Path) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "bindAddress": node.ip,
        "metricsBindAddress": f"{node.ip}:10249",
        "healthzBindAddress": f"{node.ip}:10256",
        "clusterCIDR": POD_CIDR,
        "mode": "iptables",
        # The node's namespace shares the host's conntrack table size, which it may not set.
        "conntrack": {"maxPerCore": 0, "min": 0},
    }
    return yaml.safe_dump(config, sort_keys=False)


def host_kube_proxy_config(state: Path, kubeconfig: Path, node_name: str) -> str:
    """kube-proxy on this host too, as on a control-plane node: the operator and the tests run here, and reach
    Services by their ClusterIPs as pods do. It binds the bridge's address: given a loopback one it waited 30 s
    for a Node of its name, which never comes, to learn its IP, before it wrote any rule. It takes the name of a
    real node: kube-proxy 1.36 waits up to 30 s for a Node of its own name whatever it binds (pkg/proxy/node.go),
    and until then the host reached no Service made since its last rules (an operator here saw no store rounds
    in the first job after a start). The node's name decides nothing for ClusterIPs."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": BRIDGE_IP,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        "clusterCIDR": POD_CIDR,
        "mode": "iptables",
        "conntrack": {"maxPerCore": 0, "min": 0},
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_argv(binary: Path, node: RealNode, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={node.path('kubelet.yaml')}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={node.name}", f"--node-ip={node.ip}",
            f"--root-dir={node.path('kubelet')}", f"--cert-dir={node.path('kubelet-pki')}",
            "--node-labels=localcluster.dev/node-kind=real", "--v=1"]


def containerd_argv(node: RealNode) -> list[str]:
    return ["containerd", f"--config={node.path('containerd.toml')}"]


def kube_proxy_argv(binary: Path, node: RealNode) -> list[str]:
    return [str(binary), f"--config={node.path('kube-proxy.yaml')}", "--v=1"]


def in_netns(node: RealNode, argv: list[str]) -> list[str]:
    """Only the network namespace: `ip netns exec` would also remount /sys, hiding the cgroup mounts the kubelet
    and runc need."""
    return ["nsenter", f"--net=/run/netns/{node.netns}", "--", *argv]


def resolv_conf() -> str:
    """The node's own resolver, which a pod with dnsPolicy Default gets: the host's would point nowhere here."""
    return f"nameserver {BRIDGE_IP}\n"

