"""Layout of the node agent's state dir. Every path is built here so writers and readers agree."""

from __future__ import annotations

import json
import os
from pathlib import Path

BRIDGE = "ej0"
BRIDGE_IP = "10.244.0.1"
POD_CIDR_PREFIX = 16
NETNS_PREFIX = "ej-"


def pods_root(state_dir: Path) -> Path:
    return Path(state_dir) / "pods"


def pod_dir(state_dir: Path, namespace: str, name: str, uid: str) -> Path:
    return pods_root(state_dir) / f"{namespace}_{name}_{uid}"


def runtime_file(pod_path: Path) -> Path:
    """What the agent started for one pod (netns, node, container pid files); read by faults and cleanup."""
    return pod_path / "runtime.json"


def log_file(pod_path: Path, container: str) -> Path:
    return pod_path / f"{container}.log"


def previous_log_file(pod_path: Path, container: str) -> Path:
    return pod_path / f"{container}.previous.log"


def pid_file(pod_path: Path, container: str) -> Path:
    return pod_path / f"{container}.pid"


def exit_file(pod_path: Path, container: str) -> Path:
    return pod_path / f"{container}.exit"


def termination_file(pod_path: Path, container: str) -> Path:
    return pod_path / f"{container}.termination-log"


def faults_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "faults"


def lost_marker(state_dir: Path, node: str) -> Path:
    return faults_dir(state_dir) / f"{node}.lost"


def ipam_file(state_dir: Path) -> Path:
    return Path(state_dir) / "ipam.json"


def cluster_ips_file(state_dir: Path) -> Path:
    return Path(state_dir) / "cluster-ips.json"


def netns_name(uid: str) -> str:
    # The host veth is "v" + this name and interface names have at most 15 characters.
    return NETNS_PREFIX + uid[:11]


def read_json(path: Path, default):
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def write_json(path: Path, data) -> None:
    """Write atomically: a reader (faults CLI, a restarted agent) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
