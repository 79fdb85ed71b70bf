"""Cluster DNS on the real nodes: CoreDNS as a Deployment behind the kube-dns Service (manifests/coredns.yaml)."""

from __future__ import annotations

from collections.abc import Callable

from localcluster import apply
from localcluster.layout import Layout, load_endpoints

IMAGE = "localcluster.local/coredns:1.12.4"
MANIFEST = "coredns.yaml"


def apply_manifests(layout: Layout, log: Callable[[str], None]) -> None:
    endpoints = load_endpoints(layout)
    assert endpoints is not None
    for obj in apply.load_all(layout.manifests / MANIFEST):
        apply.apply(endpoints, obj)
    log("  CoreDNS applied (kube-system/coredns, Service kube-dns 10.96.0.10)")
