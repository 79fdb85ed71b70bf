"""What a real node is made of (localcluster/realnodes/plan.py), and the preflight that runs before any starts."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest
import yaml

from localcluster.realnodes import plan, preflight, systemapps

ROOT = Path(__file__).resolve().parents[2]
STATE = Path("/work/x/.localcluster")


def three() -> list[plan.RealNode]:
    return plan.nodes(STATE, ["local-node-0", "local-node-1", "local-node-2"])


def test_nodes_share_no_address_subnet_cgroup_or_directory():
    nodes = three()
    for attribute in ("ip", "pod_subnet", "netns", "host_link", "cgroup_root", "dir", "socket"):
        values = [getattr(n, attribute) for n in nodes]
        assert len(set(values)) == len(values), attribute
    pods = ipaddress.ip_network(plan.POD_CIDR)
    bridge = ipaddress.ip_network("10.244.0.0/16")
    for node in nodes:
        subnet = ipaddress.ip_network(node.pod_subnet)
        assert subnet.subnet_of(pods) and not subnet.overlaps(bridge)
        assert ipaddress.ip_address(node.ip) in bridge  # on the bridge, where the API server listens
        assert ipaddress.ip_address(node.pod_gateway) in subnet


def test_each_node_routes_to_the_others_pods_only():
    nodes = three()
    assert plan.routes(nodes[1], nodes) == [(nodes[0].pod_subnet, nodes[0].ip), (nodes[2].pod_subnet, nodes[2].ip)]


def test_containerd_keeps_everything_under_the_node_and_never_lowers_oom_score_adj():
    node = three()[1]
    config = tomllib.loads(plan.containerd_config(node))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == plan.PAUSE_IMAGE
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": False}  # the kubelet's cgroupfs
    paths = [config["root"], config["state"], config["grpc"]["address"], config["ttrpc"]["address"],
             cri["cni"]["conf_dir"], config["plugins"]["io.containerd.internal.v1.opt"]["path"]]
    assert all(Path(p).is_relative_to(node.dir) for p in paths), paths


def test_cni_hands_out_the_node_subnet_and_keeps_its_leases_apart():
    node = three()[2]
    bridge = json.loads(plan.cni_config(node))["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["hairpinMode"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.pod_subnet, "gateway": node.pod_gateway}]]
    assert Path(bridge["ipam"]["dataDir"]).is_relative_to(node.dir)


def test_kubelet_runs_on_cgroup_v1_under_its_own_root_and_serves_on_the_node_address():
    node = three()[0]
    config = yaml.safe_load(plan.kubelet_config(node, STATE / "pki"))
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == node.cgroup_root
    assert config["address"] == node.ip
    assert config["containerRuntimeEndpoint"] == f"unix://{node.socket}"
    assert config["authentication"]["anonymous"]["enabled"] is False


def manifest(app: systemapps.SystemApp) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "localcluster" / "manifests" / app.manifest).read_text()) if d]


def test_each_system_app_runs_the_image_made_from_its_binary():
    for app in systemapps.APPS:
        deployment = next(d for d in manifest(app) if d["kind"] == "Deployment")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == app.image, app.manifest


def test_the_metrics_api_is_served_by_the_metrics_server_service():
    docs = manifest(systemapps.METRICS_SERVER)
    service = next(d for d in docs if d["kind"] == "Service")
    api = next(d for d in docs if d["kind"] == "APIService")
    assert api["spec"]["service"] == {"name": service["metadata"]["name"],
                                      "namespace": service["metadata"]["namespace"],
                                      "port": service["spec"]["ports"][0]["port"]}


def test_cluster_dns_is_the_kube_dns_service():
    service = next(d for d in manifest(systemapps.COREDNS) if d["kind"] == "Service")
    assert service["spec"]["clusterIP"] == plan.CLUSTER_DNS
    kubelet = yaml.safe_load(plan.kubelet_config(three()[0], STATE / "pki"))
    assert kubelet["clusterDNS"] == [plan.CLUSTER_DNS]


def test_the_hosts_kube_proxy_binds_an_address_that_is_not_loopback():
    # Given 127.0.0.1 it waited 30 s for a Node of its name (there is none) before writing any rule.
    config = yaml.safe_load(plan.host_kube_proxy_config(STATE, STATE / "kubeconfig", "local-node-0"))
    assert not ipaddress.ip_address(config["bindAddress"]).is_loopback
    # kube-proxy waits 30 s for a Node of its own name before its first rules: it takes a real node's.
    assert config["hostnameOverride"] == "local-node-0"


def test_node_processes_enter_only_the_network_namespace():
    # `ip netns exec` remounts /sys, which hid the cgroup mounts from the kubelet ("failed to find cgroup mounts")
    argv = plan.in_netns(three()[0], ["kubelet"])
    assert argv[0] == "nsenter" and argv[1] == "--net=/run/netns/ejnode-0" and argv[-1] == "kubelet"


@pytest.fixture
def machine(tmp_path: Path) -> dict:
    cni = tmp_path / "cni"
    cni.mkdir()
    for plugin in preflight.CNI_PLUGINS:
        (cni / plugin).touch()
    (tmp_path / "cgroup" / "memory").mkdir(parents=True)
    (tmp_path / "cgroup" / "memory" / "cgroup.procs").touch()
    (tmp_path / "bridge").mkdir()
    return {"euid": 0, "which": lambda c: f"/usr/bin/{c}", "cni_dir": cni, "cgroups": tmp_path / "cgroup",
            "bridge_sysctl": tmp_path / "bridge"}


def test_preflight_passes_a_ready_machine(machine):
    assert preflight.problems(**machine) == []


@pytest.mark.parametrize("change, expected", [
    ({"euid": 1000}, "need root"),
    ({"which": lambda c: None if c in ("containerd", "ctr") else c}, "missing commands from Debian's containerd:"),
    ({"which": lambda c: None if c == "runc" else c}, "apt-get install runc"),
])
def test_preflight_names_what_is_missing_and_what_to_do(machine, change, expected):
    found = preflight.problems(**{**machine, **change})
    assert len(found) == 1 and expected in found[0], found


def test_preflight_names_missing_cni_plugins_and_kernel_parts(machine):
    (machine["cni_dir"] / "bridge").unlink()
    machine["bridge_sysctl"].rmdir()
    found = preflight.problems(**machine)
    assert any("CNI plugins bridge" in p and "containernetworking-plugins" in p for p in found), found
    assert any("br_netfilter" in p for p in found), found
