"""scheduler-plugins' kube-scheduler as a second scheduler: Coscheduling gangs for pods that ask for it.

A pod joins a gang with `schedulerName: scheduler-plugins-scheduler` and the label
`scheduling.x-k8s.io/pod-group: <PodGroup name>`; the PodGroup (scheduling.x-k8s.io/v1alpha1, `spec.minMember`) is
a CRD installed here. The scheduler runs as the default scheduler's identity (system:kube-scheduler, the
bootstrap policy covers pods, bindings and events) plus a ClusterRole for PodGroups.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from localcluster import apply
from localcluster.layout import Endpoints

NAME = "scheduler-plugins"
BINARY = "scheduler-plugins-kube-scheduler"
SCHEDULER_NAME = "scheduler-plugins-scheduler"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PORTS = {"scheduler-plugins": 10261}
HEALTHY_WITHIN = 60.0
UNSCHEDULABLE_RETRY = "10s"
CONFIG_TEMPLATE = Path(__file__).resolve().parents[1] / "schedplugins" / "scheduler-config.yaml"
CRD_FILE = "scheduling.x-k8s.io_podgroups.yaml"
IDENTITY = "system:kube-scheduler"

RBAC = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "localcluster:scheduler-plugins"},
     "rules": [{"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups", "podgroups/status"],
                "verbs": ["get", "list", "watch", "update", "patch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "localcluster:scheduler-plugins"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                 "name": "localcluster:scheduler-plugins"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": IDENTITY}]},
]


def _kubeconfig(endpoints: Endpoints) -> Path:
    return endpoints.layout.kubeconfigs / "scheduler.yaml"


def _config_path(endpoints: Endpoints) -> Path:
    return endpoints.layout.addon_dir(NAME) / "config.yaml"


def config(kubeconfig: Path) -> dict:
    """The checked-in configuration with this cluster's kubeconfig."""
    data = yaml.safe_load(CONFIG_TEMPLATE.read_text())
    data["clientConnection"]["kubeconfig"] = str(kubeconfig)
    return data


def prepare(endpoints: Endpoints) -> None:
    """PodGroup CRD and RBAC in the cluster, the configuration on disk."""
    crds = apply.load_all(endpoints.layout.manifests / CRD_FILE)
    for obj in crds + RBAC:
        apply.apply(endpoints, obj)
    apply.wait_established(endpoints, [crd["metadata"]["name"] for crd in crds])
    path = _config_path(endpoints)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config(_kubeconfig(endpoints)), sort_keys=False))


def argv(bin_dir: Path, endpoints: Endpoints) -> list[str]:
    kubeconfig = _kubeconfig(endpoints)
    return [
        str(bin_dir / BINARY), f"--config={_config_path(endpoints)}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={endpoints.ports[NAME]}",
        f"--cert-dir={endpoints.layout.addon_dir(NAME) / 'certs'}",
        # Coscheduling wakes a rejected gang only on a Pod add or a PodGroup add/update, not when capacity frees up
        # elsewhere; the scheduler's periodic flush (every 30 s, of pods unschedulable longer than this; default
        # 5 min) is what retries it then. Short here, as the node-loss settings are.
        f"--pod-max-in-unschedulable-pods-duration={UNSCHEDULABLE_RETRY}",
    ]


def finish(endpoints: Endpoints, log) -> None:
    """Nothing to do once it serves: pods name it in schedulerName."""
