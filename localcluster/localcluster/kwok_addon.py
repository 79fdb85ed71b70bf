"""kwok (sigs.k8s.io/kwok, "Kubernetes WithOut Kubelet") and its fake nodes: fleet-size benchmarks on 2 cores.

`up --kwok` registers FAKE_NODES Nodes `kwok-node-<i>` (annotation kwok.x-k8s.io/node=fake, label
`type=kwok`, taint kwok.x-k8s.io/node=fake:NoSchedule, so only pods that tolerate it and select `type: kwok`
land there) and runs kwok's controller for them. kwok keeps their leases and Ready condition, and plays the
stages in kwok/config.yaml on their pods: a pod bound there is Running and Ready at once, with a made-up IP
taken from its uid (`fake_pod_ip`) and its creation time as its start, and goes as soon as it is deleted. No
process runs, so nothing answers at that IP (a Service in front of such pods accepts through the node agent's
proxy, then closes the connection). Capacity: kwok's defaults (1000 cpu, 1 Ti, a million pods per node).

`localcluster stop kwok` stops it and deletes its Nodes (the pod garbage collector then removes their pods);
`down` stops it with the rest.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from localcluster import apply
from localcluster.health import admin_context, api_json
from localcluster.layout import Endpoints

NAME = "kwok"
MODULE_DIR = Path(__file__).resolve().parents[1] / "kwok"
VERSION = re.search(r"^require sigs\.k8s\.io/kwok (v\S+)", (MODULE_DIR / "go.mod").read_text(), re.M).group(1)
BINARY = f"kwok-{VERSION}"  # the version in the name: build_addons.sh builds a new one when go.mod moves
PORTS = {"kwok": 10262}
HEALTHY_WITHIN = 60.0
CONFIG = MODULE_DIR / "config.yaml"
FAKE_NODES = 10
NODE_PREFIX = "kwok-node-"
ANNOTATION = ("kwok.x-k8s.io/node", "fake")
LABEL = ("type", "kwok")
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
# What a pod needs to go to a fake node (and only there).
POD_PLACEMENT = {"nodeSelector": {LABEL[0]: LABEL[1]},
                 "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}]}


def fake_pod_ip(uid: str) -> str:
    """The address kwok/config.yaml's pod-ready stage gives a pod: five hex digits of its uid in 10.248.0.0/14.

    From the uid, not kwok's pool, so that the stage played twice for one pod writes the same address twice."""
    digits = [int(char, 16) for char in uid[:5]]
    return f"10.{248 + digits[0] % 4}.{digits[1] * 16 + digits[2]}.{digits[3] * 16 + digits[4]}"


def node(index: int) -> dict:
    name = f"{NODE_PREFIX}{index}"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {ANNOTATION[0]: ANNOTATION[1]},
                         "labels": {LABEL[0]: LABEL[1], "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64"}},
            "spec": {"taints": [TAINT]}}


def prepare(endpoints: Endpoints) -> None:
    for index in range(FAKE_NODES):
        apply.apply(endpoints, node(index))


def argv(bin_dir: Path, endpoints: Endpoints) -> list[str]:
    return [str(bin_dir / BINARY), f"--kubeconfig={endpoints.layout.kubeconfig}", f"--config={CONFIG}",
            f"--manage-nodes-with-annotation-selector={ANNOTATION[0]}={ANNOTATION[1]}",
            f"--server-address=127.0.0.1:{endpoints.ports[NAME]}", "--v=WARN"]


def fake_nodes_ready(endpoints: Endpoints) -> int:
    found = api_json(endpoints, f"/api/v1/nodes?labelSelector={LABEL[0]}%3D{LABEL[1]}").get("items", [])
    return sum(1 for n in found if any(c.get("type") == "Ready" and c.get("status") == "True"
                                       for c in (n.get("status") or {}).get("conditions") or []))


def finish(endpoints: Endpoints, log) -> None:
    """Returns once kwok has made every fake node Ready."""
    deadline = time.monotonic() + HEALTHY_WITHIN
    while (ready := fake_nodes_ready(endpoints)) < FAKE_NODES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {ready}/{FAKE_NODES} kwok nodes Ready after {HEALTHY_WITHIN:.0f}s")
        time.sleep(0.25)
    log(f"  {FAKE_NODES} kwok nodes Ready ({NODE_PREFIX}0..{FAKE_NODES - 1}, label {LABEL[0]}={LABEL[1]}, "
        f"taint {TAINT['key']})")


def cleanup(endpoints: Endpoints, log) -> None:
    """After the process stopped: its Nodes go (their pods with them, by the pod garbage collector)."""
    for index in range(FAKE_NODES):
        request = urllib.request.Request(f"{endpoints.server}/api/v1/nodes/{NODE_PREFIX}{index}", method="DELETE")
        try:
            urllib.request.urlopen(request, context=admin_context(endpoints.layout), timeout=30).close()
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
    log(f"  deleted the {FAKE_NODES} kwok nodes")
