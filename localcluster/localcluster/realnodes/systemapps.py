"""The cluster's own Deployments on the real nodes, each one static Go binary built from its module (build.sh),
made into an image FROM scratch (images.py) and applied from its manifest in manifests/:

- CoreDNS behind the kube-dns Service (the kubelets' clusterDNS, plan.CLUSTER_DNS), so pods resolve Services;
- metrics-server behind metrics.k8s.io, so `kubectl top` and HorizontalPodAutoscalers see pods' CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localcluster import apply
from localcluster.layout import Layout, load_endpoints


@dataclass(frozen=True)
class SystemApp:
    binary: str
    image: str
    manifest: str
    what: str


COREDNS = SystemApp("coredns", "localcluster.local/coredns:1.12.4", "coredns.yaml",
                    "CoreDNS (kube-system/coredns, Service kube-dns 10.96.0.10)")
METRICS_SERVER = SystemApp("metrics-server", "localcluster.local/metrics-server:0.8.0", "metrics-server.yaml",
                           "metrics-server (kube-system/metrics-server, APIService v1beta1.metrics.k8s.io)")
APPS = (COREDNS, METRICS_SERVER)


def apply_manifests(layout: Layout, log: Callable[[str], None]) -> None:
    endpoints = load_endpoints(layout)
    assert endpoints is not None
    for app in APPS:
        for obj in apply.load_all(layout.manifests / app.manifest):
            apply.apply(endpoints, obj)
        log(f"  {app.what} applied")
