"""Fake GPUs on the real nodes: a device plugin (fakegpu/main.go, built by build_addons.sh) speaks the kubelet's
device-plugin gRPC API on every node and advertises GPUS_PER_NODE `nvidia.com/gpu`, so that the scheduler, the
kubelet's allocation, Kueue's GPU quota and `nprocPerNode: auto` run end to end on a machine without a GPU. Each
allocation sets NVIDIA_VISIBLE_DEVICES, as NVIDIA's plugin does; no device is mounted, training uses gloo.

The kubelet serves its device-plugin registry at a path it does not let anyone change
(/var/lib/kubelet/device-plugins/kubelet.sock), and every node here shares the host's filesystem: each kubelet
would take that socket from the last. So each kubelet runs in a mount namespace of its own, where its node's
directory is mounted at that path. That namespace starts as a copy of the host's, whose mounts are private: the
kubelet's root directory is therefore made a shared mount first, so the volumes the kubelet mounts there reach
containerd, which runs in the host's mount namespace.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from pathlib import Path

from localcluster import builds
from localcluster.layout import Layout
from localcluster.realnodes.plan import RealNode

PART = "fakegpu"
RESOURCE = "nvidia.com/gpu"
GPUS_PER_NODE = 2
KUBELET_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
MODULE_DIR = Path(__file__).resolve().parents[2] / "fakegpu"
# Its sources' hash in the name: a change to main.go or go.mod builds a new binary beside the old one.
BINARY = "fakegpu-" + hashlib.sha256(b"".join(
    (MODULE_DIR / name).read_bytes() for name in ("main.go", "go.mod", "go.sum"))).hexdigest()[:12]


def ensure_binary(layout: Layout, log: Callable[[str], None]) -> Path:
    return builds.run(layout.addons_build_script, [BINARY], "the fake GPU device plugin", log) / BINARY


def binary(layout: Layout) -> Path:
    return builds.bin_dir(layout.addons_build_script) / BINARY


def plugin_dir(node: RealNode) -> Path:
    return node.path("device-plugins")


def prepare(node: RealNode) -> None:
    """The node's plugin directory, and its kubelet root directory as a shared mount (see the module's doc)."""
    plugin_dir(node).mkdir(parents=True, exist_ok=True)
    KUBELET_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    root = node.path("kubelet")
    root.mkdir(parents=True, exist_ok=True)
    if not _is_mount(root):
        subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-shared", str(root)], check=True)


def kubelet_argv(node: RealNode, kubelet: list[str]) -> list[str]:
    """The kubelet in a mount namespace where the node's plugin directory is the kubelet's fixed one."""
    script = f'mount --bind "$0" {KUBELET_PLUGIN_DIR} && exec "$@"'
    return ["unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", script,
            str(plugin_dir(node)), *kubelet]


def argv(binary_path: Path, node: RealNode) -> list[str]:
    return [str(binary_path), f"--plugin-dir={plugin_dir(node)}", f"--resource={RESOURCE}",
            f"--count={GPUS_PER_NODE}", f"--node={node.name}"]


def _is_mount(path: Path) -> bool:
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return str(path) in mounts
