"""Volumes on the local nodes: one mounted over a folder that holds the repository (which stands in for the
image) and the cluster's state hides neither, as the chart's emptyDir on /tmp did for a clone under /tmp."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
STARTUP = 60

pytestmark = pytest.mark.process_nodes


@pytest.fixture
def core(cluster, kube) -> client.CoreV1Api:
    if cluster.kind != "local" or cluster.node_kind != "process":
        pytest.skip("tests the local cluster's process-backed node agent (make test-process-nodes)")
    return client.CoreV1Api(kube)


def test_a_volume_over_the_repositorys_folder_hides_neither_it_nor_later_volumes(core, namespace):
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="settings"), data={"greeting": "hello from the config map"}))
    # kopf is in the repository's venv only: the venv, under the covered folder, must still run the command.
    script = ("import pathlib, sys, kopf; print(pathlib.Path('/etc/settings/greeting').read_text()); "
              f"pathlib.Path('{ROOT.parent}/scratch').write_text('x'); print(sys.prefix)")
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "covered"},
                                           "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "local", "command": ["python", "-c", script],
                        "volumeMounts": [{"name": "scratch", "mountPath": str(ROOT.parent)},
                                         {"name": "settings", "mountPath": "/etc/settings"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}},
                    {"name": "settings", "configMap": {"name": "settings"}}]}})
    pod = wait_for(lambda: core.read_namespaced_pod("covered", namespace), STARTUP, "the pod to finish",
                   until=lambda p: p.status.phase in ("Succeeded", "Failed"))
    log = core.read_namespaced_pod_log("covered", namespace)
    assert pod.status.phase == "Succeeded", log
    assert "hello from the config map" in log
    # The emptyDir took the write, not the host's folder.
    assert not (ROOT.parent / "scratch").exists()
