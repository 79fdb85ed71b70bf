"""NetworkPolicies enforced on the real nodes, as on a real cluster: kube-network-policies (the implementation
kind ships, sigs.k8s.io/kube-network-policies, built by build_addons.sh with netpol/main.go) runs in every
node's network namespace, started and stopped with the node's kubelet and kube-proxy (node.py), as a node
process with a client certificate of its own (user `kube-network-policies`, bound by
manifests/kube-network-policies.yaml to what it reads: pods, namespaces, networkpolicies).

It diverts the first packet of each connection to or from a pod that a policy selects (nftables, postrouting)
to an nfqueue, and answers it from the policies. A kernel built without nftables' queue expression
(`CONFIG_NFT_QUEUE`, as this machine's) refuses upstream's rules (`netlink receive: no such file or directory`
in its log, at every sync): there iptables' NFQUEUE target (`CONFIG_NETFILTER_XT_TARGET_NFQUEUE`) diverts the
packets instead, to the same queue and the same answers (`--iptables-divert`, netpol/main.go).
Two exemptions, both deliberate:
- a node's own root processes (upstream's rule): the kubelet's probes reach its pods whatever the policies say;
- this host (--admit-cidr BRIDGE_IP/32): every ingress rule that lists sources also admits it. The host is the
  control-plane node, where an operator run as a process (the soak, the scenarios that lose a node) and the
  tests themselves reach pods from; an operator in a pod gets no exemption from it.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path

from localcluster import apply, builds, components, pki
from localcluster.layout import Endpoints, Layout
from localcluster.realnodes.plan import POD_CIDR, RealNode, in_netns
from localcluster.state import BRIDGE_IP

PART = "network-policies"
USER = "kube-network-policies"
MANIFEST = "kube-network-policies.yaml"
MODULE_DIR = Path(__file__).resolve().parents[2] / "netpol"
_REQUIRE = re.search(r"^\s*sigs\.k8s\.io/kube-network-policies (v\S+)", (MODULE_DIR / "go.mod").read_text(), re.M)
assert _REQUIRE is not None, "netpol/go.mod requires no sigs.k8s.io/kube-network-policies"
VERSION = _REQUIRE.group(1)
BINARY = f"kube-network-policies-{VERSION}"  # the version in the name: a new go.mod builds a new binary


def ensure_binary(layout: Layout, log: Callable[[str], None]) -> Path:
    """Builds it the first time (about a minute after the control plane), then only finds it."""
    return builds.run(layout.addons_build_script, [BINARY], "kube-network-policies", log) / BINARY


def binary(layout: Layout) -> Path:
    return builds.bin_dir(layout.addons_build_script) / BINARY


def write_files(layout: Layout, endpoints: Endpoints, node: RealNode) -> None:
    pki.issue_client_cert(layout.pki, USER, USER)
    server = f"https://{BRIDGE_IP}:{endpoints.ports['apiserver']}"
    components.write_kubeconfig(node.path(f"{PART}.kubeconfig"), server, layout.pki, USER, USER)


def argv(binary_path: Path, node: RealNode, nft_queue: bool) -> list[str]:
    divert = [] if nft_queue else [f"--iptables-divert={POD_CIDR}"]
    return in_netns(node, [str(binary_path), f"--kubeconfig={node.path(f'{PART}.kubeconfig')}",
                           f"--hostname-override={node.name}", f"--admit-cidr={BRIDGE_IP}/32", *divert, "--v=1"])


def kernel_has_nft_queue(config: Path = Path("/proc/config.gz")) -> bool:
    """False only where the kernel's own configuration says it lacks it; unknown (no /proc/config.gz) is taken
    for a kernel that has it, as distributions build it."""
    try:
        text = gzip.decompress(config.read_bytes()).decode(errors="replace")
    except OSError:
        return True
    return "# CONFIG_NFT_QUEUE is not set" not in text


def apply_rbac(layout: Layout, endpoints: Endpoints) -> None:
    for obj in apply.load_all(layout.manifests / MANIFEST):
        apply.apply(endpoints, obj)
