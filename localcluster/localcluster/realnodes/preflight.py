"""What a machine needs before real nodes can start, checked before anything starts: each problem is one line
saying what is missing and what to do, so that `localcluster up --real-nodes` fails whole, not half-started."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from localcluster.realnodes.plan import CNI_BIN_DIR

# command -> the Debian package that has it
COMMANDS = {
    "containerd": "containerd", "ctr": "containerd", "runc": "runc", "nsenter": "util-linux",
    "iptables": "iptables", "ip": "iproute2", "buildah": "buildah", "mmdebstrap": "mmdebstrap",
}
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
INSTALL = "run localcluster/host-packages.sh (as root), or apt-get install"


def problems(euid: int = -1, which: Callable[[str], str | None] = shutil.which, cni_dir: Path = Path(CNI_BIN_DIR),
             cgroups: Path = Path("/sys/fs/cgroup"), bridge_sysctl: Path = Path("/proc/sys/net/bridge")) -> list[str]:
    found = []
    if (os.geteuid() if euid < 0 else euid) != 0:
        found.append("real nodes need root (network namespaces, cgroups, mounts): run as root")
    missing = sorted({COMMANDS[c] for c in COMMANDS if which(c) is None})
    if missing:
        found.append(f"missing commands from Debian's {', '.join(missing)}: {INSTALL} {' '.join(missing)}")
    plugins = [p for p in CNI_PLUGINS if not (cni_dir / p).exists()]
    if plugins:
        found.append(f"CNI plugins {', '.join(plugins)} not in {cni_dir}: {INSTALL} containernetworking-plugins")
    if not (cgroups / "memory" / "cgroup.procs").exists() and not (cgroups / "cgroup.controllers").exists():
        found.append(f"no cgroup hierarchy mounted under {cgroups}: the kubelet cannot run pods here")
    if not bridge_sysctl.is_dir():
        found.append("the kernel's br_netfilter is not loaded (no /proc/sys/net/bridge): modprobe br_netfilter")
    return found
