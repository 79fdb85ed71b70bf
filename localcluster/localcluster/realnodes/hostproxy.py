"""kube-proxy in this host's own network namespace, so that processes here (the operator run by the integration
tests, the tests themselves, the benchmarks) reach ClusterIPs as pods do. `stop` also removes its rules from the
host's iptables (`kube-proxy --cleanup`); the nodes' rules go with their namespaces.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from localcluster import components, pki, sessions
from localcluster.layout import Endpoints, Layout
from localcluster.realnodes.plan import host_kube_proxy_config
from localcluster.state import BRIDGE_IP

NAME = "host-kube-proxy"
KUBERNETES_SERVICE = "10.96.0.1"


def start(layout: Layout, endpoints: Endpoints, bin_dir: Path, node_name: str) -> None:
    stop(layout, bin_dir)
    directory = layout.state / NAME
    directory.mkdir(parents=True, exist_ok=True)
    pki.issue_client_cert(layout.pki, "kube-proxy", "system:kube-proxy")
    kubeconfig = directory / "kubeconfig"
    components.write_kubeconfig(kubeconfig, f"https://{BRIDGE_IP}:{endpoints.ports['apiserver']}", layout.pki,
                                "kube-proxy", "kube-proxy")
    (directory / "config.yaml").write_text(host_kube_proxy_config(layout.state, kubeconfig, node_name))
    sessions.start(layout, NAME, [str(bin_dir / "kube-proxy"), f"--config={directory / 'config.yaml'}", "--v=1"])


def wait_serving(layout: Layout, timeout: float = 60) -> None:
    """Until this host reaches the API server at the `kubernetes` Service's ClusterIP: kube-proxy has written its
    rules (an operator started here before that never reached its stores)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((KUBERNETES_SERVICE, 443), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"this host cannot reach ClusterIPs {timeout:.0f}s after kube-proxy started; "
                                   f"see {layout.log_file(NAME)}") from None
            time.sleep(0.2)


def stop(layout: Layout, bin_dir: Path) -> None:
    pid = sessions.read_pid(layout, NAME)
    if pid is not None and sessions.ours(layout, pid):
        sessions.stop_sessions([pid], 5)
    layout.pid_file(NAME).unlink(missing_ok=True)
    if (layout.state / NAME).is_dir():
        subprocess.run([str(bin_dir / "kube-proxy"), "--cleanup"], capture_output=True)
