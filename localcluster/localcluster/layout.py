"""Where one local cluster keeps its state under a repository root, and what cluster.json records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """Where everything of one cluster lives under a repository root."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / ".localcluster"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.state / "etcd"

    @property
    def kubeconfigs(self) -> Path:
        return self.state / "kubeconfigs"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def cluster_file(self) -> Path:
        return self.state / "cluster.json"

    @property
    def build_script(self) -> Path:
        return self.root / "localcluster" / "build.sh"

    @property
    def addons_build_script(self) -> Path:
        return self.root / "localcluster" / "build_addons.sh"

    @property
    def manifests(self) -> Path:
        return self.root / "localcluster" / "manifests"

    def addon_dir(self, name: str) -> Path:
        """Configuration and runtime files of an add-on (kept across runs, rewritten at each start)."""
        return self.state / name

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"


@dataclass
class Endpoints:
    layout: Layout
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"


def load_endpoints(layout: Layout) -> Endpoints | None:
    try:
        data = json.loads(layout.cluster_file.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return Endpoints(layout, data["ports"])


def record(layout: Layout, endpoints: Endpoints, nodes: int) -> None:
    layout.cluster_file.write_text(json.dumps({"ports": endpoints.ports, "nodes": nodes}, indent=2))


def recorded_nodes(layout: Layout) -> int:
    try:
        return json.loads(layout.cluster_file.read_text()).get("nodes", 0)
    except (FileNotFoundError, ValueError):
        return 0
