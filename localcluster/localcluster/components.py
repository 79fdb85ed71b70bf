"""Command lines and kubeconfigs of the control-plane components and the node agent."""

from __future__ import annotations

import base64
import importlib.util
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster.layout import Endpoints, Layout
from localcluster.state import BRIDGE_IP

SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_CIDR = "10.244.0.0/16"
# Small on purpose: node-loss tests should see a lost node within seconds, not minutes.
NODE_MONITOR_GRACE = "20s"
NOT_READY_TOLERATION_SECONDS = 20
DEFAULT_PORTS = {"apiserver": 6443, "etcd": 2379, "etcd-peer": 2380, "controller-manager": 10257, "scheduler": 10259}
# The upstream Workload API (scheduling.k8s.io/v1alpha2 Workload and PodGroup, what `gang: Workload` creates) and the
# default scheduler's gang scheduling, both alpha in v1.36: the same gates on the apiserver, the scheduler and the
# controller-manager. Keyed by minor: no other release serves v1alpha2 (1.35 has v1alpha1, 1.37 v1alpha3 and no
# GangScheduling gate, 1.33 and 1.34 neither gate), and a component refuses to start on a gate or a group version
# it does not know, so theirs start without the Workload API.
WORKLOAD_API = {36: ("GenericWorkload=true,GangScheduling=true", "scheduling.k8s.io/v1alpha2=true")}
# The apiserver listens on every address: 127.0.0.1 for kubeconfigs on this host, and the pod bridge's address,
# which it advertises as the `kubernetes` Service's endpoint so that pods reach it (in-cluster config).
APISERVER_BIND = "0.0.0.0"


def release(bin_dir: Path) -> str:
    """The Kubernetes version of the binaries in bin_dir (build.sh builds one release per bin dir), e.g. v1.33.13."""
    out = subprocess.run([str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return out.split()[-1]


def _minor(bin_dir: Path) -> int:
    return int(release(bin_dir).split(".")[1])


def _feature_gates(bin_dir: Path) -> list[str]:
    gates = WORKLOAD_API.get(_minor(bin_dir))
    return [f"--feature-gates={gates[0]}"] if gates else []


def _runtime_config(bin_dir: Path) -> list[str]:
    gates = WORKLOAD_API.get(_minor(bin_dir))
    return [f"--runtime-config={gates[1]}"] if gates else []


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As Go servers do, so that a port the previous run left in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def choose_ports(apiserver_port: int | None, wanted: dict[str, int] | None = None) -> dict[str, int]:
    wanted = dict(DEFAULT_PORTS if wanted is None else wanted)
    if apiserver_port:
        wanted["apiserver"] = apiserver_port
    ports = {}
    for name, port in wanted.items():
        if _port_free(port, APISERVER_BIND if name == "apiserver" else "127.0.0.1"):
            ports[name] = port
        elif name == "apiserver" and apiserver_port:
            raise RuntimeError(f"port {port} asked for the apiserver is busy")
        else:
            ports[name] = _any_free_port()
    return ports


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Path, client: str, user: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "localcluster", "cluster": {
            "server": server, "certificate-authority-data": _b64(pki / "ca.crt")}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": _b64(pki / f"{client}.crt"),
            "client-key-data": _b64(pki / f"{client}.key")}}],
        "contexts": [{"name": "localcluster", "context": {"cluster": "localcluster", "user": user}}],
        "current-context": "localcluster",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def write_kubeconfigs(endpoints: Endpoints) -> None:
    layout = endpoints.layout
    write_kubeconfig(layout.kubeconfig, endpoints.server, layout.pki, "admin", "admin")
    for name in ("controller-manager", "scheduler"):
        write_kubeconfig(layout.kubeconfigs / f"{name}.yaml", endpoints.server, layout.pki, name, name)


def etcd_argv(bin_dir: Path, endpoints: Endpoints) -> list[str]:
    ports, layout = endpoints.ports, endpoints.layout
    peer = f"http://127.0.0.1:{ports['etcd-peer']}"
    client = f"http://127.0.0.1:{ports['etcd']}"
    return [
        str(bin_dir / "etcd"), "--name=localcluster", f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=localcluster={peer}", "--initial-cluster-state=new",
        # A throwaway test cluster: fsync only slows every write down.
        "--unsafe-no-fsync", "--log-level=warn",
        # The default 2 GiB fills with the history of a 10,000-job fleet (50,000 pods, each written several
        # times, twice: bench/fleet_scale.py) before the API server's compaction frees it.
        f"--quota-backend-bytes={8 * 2**30}",
    ]


def apiserver_argv(bin_dir: Path, endpoints: Endpoints, profiling: bool = False) -> list[str]:
    pki = endpoints.layout.pki
    return [
        str(bin_dir / "kube-apiserver"),
        f"--bind-address={APISERVER_BIND}", f"--advertise-address={BRIDGE_IP}",
        f"--secure-port={endpoints.ports['apiserver']}",
        *_feature_gates(bin_dir), *_runtime_config(bin_dir),
        f"--etcd-servers=http://127.0.0.1:{endpoints.ports['etcd']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--allow-privileged=true",
        f"--requestheader-client-ca-file={pki / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        f"--default-not-ready-toleration-seconds={NOT_READY_TOLERATION_SECONDS}",
        f"--default-unreachable-toleration-seconds={NOT_READY_TOLERATION_SECONDS}",
        f"--cert-dir={endpoints.layout.state / 'apiserver-certs'}",
        # Off unless asked (`up --profiling`): bench/fleet_scale.py --profile reads where the API server's CPU goes.
        f"--profiling={'true' if profiling else 'false'}",
        # Pods are removed one at a time by a deletecollection by default: 50,000 of a 10,000-job fleet take
        # minutes (bench/fleet_scale.py between its runs).
        "--delete-collection-workers=8",
    ]


def _delegating_flags(kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
    ]


def controller_manager_argv(bin_dir: Path, endpoints: Endpoints) -> list[str]:
    layout = endpoints.layout
    pki = layout.pki
    return [
        str(bin_dir / "kube-controller-manager"),
        *_delegating_flags(layout.kubeconfigs / "controller-manager.yaml"),
        f"--secure-port={endpoints.ports['controller-manager']}",
        f"--cert-dir={layout.state / 'controller-manager-certs'}",
        "--controllers=*", "--leader-elect=false", "--use-service-account-credentials=true",
        *_feature_gates(bin_dir),
        f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--cluster-cidr={CLUSTER_CIDR}", "--allocate-node-cidrs=false", f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE}", "--node-monitor-period=2s",
        "--profiling=false",
        # The defaults (20 requests a second) take the namespace controller 8 minutes to delete 10,000 Services;
        # large clusters raise them, as here (bench/fleet_scale.py).
        "--kube-api-qps=100", "--kube-api-burst=200",
    ]


def scheduler_argv(bin_dir: Path, endpoints: Endpoints) -> list[str]:
    layout = endpoints.layout
    return [
        str(bin_dir / "kube-scheduler"),
        *_delegating_flags(layout.kubeconfigs / "scheduler.yaml"),
        f"--secure-port={endpoints.ports['scheduler']}",
        f"--cert-dir={layout.state / 'scheduler-certs'}",
        "--leader-elect=false", "--profiling=false", *_feature_gates(bin_dir),
        # Binds at most 50 pods a second by default: 17 minutes for a 10,000-job fleet, the same for the
        # operator and the bare client it is compared with. Large clusters raise it, as here.
        "--kube-api-qps=300", "--kube-api-burst=600",
    ]


@dataclass(frozen=True)
class NodeOptions:
    count: int = 3
    gpus_per_node: int = 0
    cpu: str = "8"
    memory: str = "16Gi"
    # "real": kubelet, containerd, runc (realnodes/); "process": the node agent (localcluster/nodeagent.py).
    kind: str = "real"


def nodeagent_available() -> bool:
    return importlib.util.find_spec("localcluster.nodeagent") is not None


def nodeagent_argv(layout: Layout, nodes: NodeOptions) -> list[str]:
    return [
        sys.executable, "-m", "localcluster.nodeagent",
        "--kubeconfig", str(layout.kubeconfig), "--state-dir", str(layout.state),
        "--nodes", str(nodes.count), "--gpus-per-node", str(nodes.gpus_per_node),
        "--node-cpu", nodes.cpu, "--node-memory", nodes.memory,
    ]


def nodeagent_cleanup_argv(layout: Layout) -> list[str]:
    return [sys.executable, "-m", "localcluster.nodeagent", "--cleanup", "--state-dir", str(layout.state)]
