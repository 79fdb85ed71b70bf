"""Start, stop and lose one real node: containerd, the kubelet, kube-proxy and kube-network-policies in the node's
network namespace, and its fake GPUs' device plugin (gpus.py), each a session of its own (sessions.py), named
`<node>-containerd`, `<node>-kubelet`, `<node>-kube-proxy`, `<node>-network-policies`, `<node>-fakegpu`.

What outlives those processes is swept by `sweep`: the runc shims (started by containerd, in its session but
re-parented), every process in the node's cgroups (its pods), the mounts under the node's directory and its
network namespace. A lost node is exactly that sweep without the kubelet's goodbye: the API server hears
nothing more from it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from pathlib import Path

from localcluster import components, pki, registry, sessions
from localcluster.layout import Endpoints, Layout
from localcluster.realnodes import gpus, netns, netpolicy
from localcluster.realnodes.plan import (
    RealNode,
    cni_config,
    containerd_argv,
    containerd_config,
    hosts_toml,
    in_netns,
    kube_proxy_argv,
    kube_proxy_config,
    kubelet_argv,
    kubelet_config,
    resolv_conf,
)
from localcluster.state import BRIDGE_IP

PARTS = ("containerd", "kubelet", "kube-proxy", netpolicy.PART, gpus.PART)
CGROUP_FS = Path("/sys/fs/cgroup")
STOP_GRACE_SECONDS = 10.0


def component(node: RealNode, part: str) -> str:
    return f"{node.name}-{part}"


def write_files(layout: Layout, endpoints: Endpoints, node: RealNode) -> None:
    for sub in ("run", "cni", "pod-logs", "kubelet", "opt"):
        node.path(sub).mkdir(parents=True, exist_ok=True)
    node.path("containerd.toml").write_text(containerd_config(node))
    hosts = node.path("certs.d", registry.ADDRESS)
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / "hosts.toml").write_text(hosts_toml(registry.ADDRESS, layout.pki / "ca.crt"))
    (node.path("cni") / "10-localcluster.conflist").write_text(cni_config(node))
    node.path("kubelet.yaml").write_text(kubelet_config(node, layout.pki))
    node.path("resolv.conf").write_text(resolv_conf())
    server = f"https://{BRIDGE_IP}:{endpoints.ports['apiserver']}"
    client = f"node-{node.name}"
    pki.issue_client_cert(layout.pki, client, f"system:node:{node.name}", "system:nodes")
    pki.issue_serving_cert(layout.pki, pki.ServingCert(f"kubelet-{node.name}", node.name, (node.name,), (node.ip,)))
    components.write_kubeconfig(node.path("kubelet.kubeconfig"), server, layout.pki, client, client)
    pki.issue_client_cert(layout.pki, "kube-proxy", "system:kube-proxy")
    components.write_kubeconfig(node.path("kube-proxy.kubeconfig"), server, layout.pki, "kube-proxy", "kube-proxy")
    node.path("kube-proxy.yaml").write_text(kube_proxy_config(node, node.path("kube-proxy.kubeconfig")))
    netpolicy.write_files(layout, endpoints, node)


def make_cgroups(node: RealNode) -> None:
    """The kubelet (cgroupfs driver, cgroup v1) wants its cgroupRoot in every hierarchy before it starts."""
    for hierarchy in _hierarchies():
        (hierarchy / node.cgroup_root.lstrip("/")).mkdir(exist_ok=True)


def start(layout: Layout, endpoints: Endpoints, node: RealNode, everyone: list[RealNode], bin_dir: Path) -> None:
    """Starts the node afresh: whatever of it still runs is stopped first (two containerds on one state, or a
    kubelet left in a namespace that was replaced, would serve pods no network reaches)."""
    stop(layout, node, grace=2)
    write_files(layout, endpoints, node)
    make_cgroups(node)
    netns.create(node, everyone)
    node.socket.unlink(missing_ok=True)  # a socket left by the last run would pass for this one's
    # Each restarted whenever it exits, as a node's systemd units are: the kubelet exits when it finds the CRI
    # still initializing, which a containerd that has just opened its socket may be.
    sessions.start(layout, component(node, "containerd"), in_netns(node, containerd_argv(node)), restart=True)
    wait_for_socket(layout, node, 30)
    gpus.prepare(node)
    kubelet = gpus.kubelet_argv(node, kubelet_argv(bin_dir / "kubelet", node, node.path("kubelet.kubeconfig")))
    sessions.start(layout, component(node, "kubelet"), in_netns(node, kubelet), restart=True)
    sessions.start(layout, component(node, gpus.PART), gpus.argv(gpus.binary(layout), node), restart=True)
    sessions.start(layout, component(node, "kube-proxy"), in_netns(node, kube_proxy_argv(bin_dir / "kube-proxy", node)),
                   restart=True)
    policies = netpolicy.argv(netpolicy.binary(layout), node, netpolicy.kernel_has_nft_queue())
    sessions.start(layout, component(node, netpolicy.PART), policies, restart=True)


def wait_for_socket(layout: Layout, node: RealNode, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    name = component(node, "containerd")
    while not node.socket.exists():
        pid = sessions.read_pid(layout, name)
        if pid is None or not sessions.alive(pid):
            raise RuntimeError(f"{name} exited; log tail:\n{sessions.tail(layout.log_file(name))}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} opened no socket in {timeout:.0f}s; log tail:\n"
                               f"{sessions.tail(layout.log_file(name))}")
        time.sleep(0.2)


def stop(layout: Layout, node: RealNode, grace: float = STOP_GRACE_SECONDS) -> None:
    """The kubelet, kube-proxy, the policies and the device plugin first, then the runtime, then whatever the pods
    left."""
    for part in ("kubelet", "kube-proxy", netpolicy.PART, gpus.PART, "containerd"):
        _stop_component(layout, component(node, part), grace)
    sweep(layout, node)


def lose(layout: Layout, node: RealNode) -> None:
    """The node is gone at once, as a machine that lost power: nothing is told, nothing is drained."""
    _kill_cgroups(node)
    for part in PARTS:
        _stop_component(layout, component(node, part), 0)
    sweep(layout, node)


def sweep(layout: Layout, node: RealNode) -> None:
    _kill_named(node)
    _kill_cgroups(node)
    _unmount_under(node.dir)
    netns.delete(node)


def _stop_component(layout: Layout, name: str, grace: float) -> None:
    pid = sessions.read_pid(layout, name)
    if pid is not None and sessions.ours(layout, pid):
        sessions.stop_sessions([pid], grace)
    layout.pid_file(name).unlink(missing_ok=True)


def _kill_named(node: RealNode) -> None:
    """Every process that names the node's directory on its command line: its containerd, kubelet and
    kube-proxy (a pid file may name a newer one) and containerd's shims (re-parented, in no session of ours)."""
    needle = str(node.dir) + "/"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and needle in sessions.cmdline(int(entry.name)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _kill_cgroups(node: RealNode) -> None:
    root = CGROUP_FS / "pids" / node.cgroup_root.lstrip("/")
    for _ in range(20):
        pids = _pids_under(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for hierarchy in _hierarchies():
        top = hierarchy / node.cgroup_root.lstrip("/")
        if top.is_dir():
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    path.rmdir()


def _pids_under(root: Path) -> list[int]:
    """Every process in the cgroups under root. The tree changes while it is read (a container that exits takes
    its cgroup with it), so a cgroup gone meanwhile holds no process."""
    pids = []
    for folder, _, files in os.walk(root):  # os.walk skips a folder that vanishes before it is listed
        if "cgroup.procs" in files:
            try:
                pids += [int(p) for p in (Path(folder) / "cgroup.procs").read_text().split()]
            except OSError as gone:  # ENOENT or ESRCH; ENODEV when the cgroup goes between open and read
                if gone.errno not in (errno.ENOENT, errno.ESRCH, errno.ENODEV):
                    raise
    return pids


def live_pod_uids(node: RealNode) -> set[str]:
    """The uids of the node's pods that have a process running besides their sandbox's pause: what really runs,
    whatever the API says (the kubelet's cgroupfs layout: <cgroupRoot>/kubepods[/<qos>]/pod<uid>/<container>)."""
    root = CGROUP_FS / "pids" / node.cgroup_root.lstrip("/")
    live = set()
    pod_dirs = [Path(folder) for folder, _, _ in os.walk(root) if Path(folder).name.startswith("pod")]
    for pod_dir in pod_dirs:
        if any(sessions.cmdline(pid).strip() not in ("", "/pause") for pid in _pids_under(pod_dir)):
            live.add(pod_dir.name.removeprefix("pod").replace("_", "-"))
    return live



def _unmount_under(directory: Path) -> None:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    prefix = str(directory) + "/"
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)


def _hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, systemd's named one, the unified one): the kubelet checks
    its cgroupRoot in each."""
    return [p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()]
