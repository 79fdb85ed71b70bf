"""Liveness probes on the local nodes, as a kubelet runs them: failureThreshold failures in a row restart the
container (restartPolicy permitting), with Unhealthy and Killing Events on the pod."""

from __future__ import annotations

import pytest
from kubernetes import client

from helpers import wait_for

STARTUP = 60
# Healthy for its first 3 seconds, then every GET answers 500: a process that breaks after starting. It exits
# 143 on SIGTERM (as PID 1 of its PID namespace it would otherwise ignore it, and wait for the SIGKILL).
SERVER = """
import http.server, os, signal, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
started = time.monotonic()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.monotonic() - started < 3 else 500)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), Health).serve_forever()
"""
LIVENESS = {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 1, "failureThreshold": 2,
            "timeoutSeconds": 1}

pytestmark = pytest.mark.process_nodes


@pytest.fixture
def core(cluster, kube) -> client.CoreV1Api:
    if cluster.kind != "local" or cluster.node_kind != "process":
        pytest.skip("tests the local cluster's process-backed node agent (make test-process-nodes)")
    return client.CoreV1Api(kube)


def pod_body(name: str, restart: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": restart, "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "server", "image": "local", "command": ["python", "-c", SERVER],
                        "ports": [{"name": "health", "containerPort": 8000}], "livenessProbe": LIVENESS}]}}


def read(core: client.CoreV1Api, namespace: str, name: str) -> dict:
    return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))


def reasons(core: client.CoreV1Api, namespace: str, name: str) -> list[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e.reason for e in events]


def test_a_failing_liveness_probe_restarts_the_container(core, namespace):
    core.create_namespaced_pod(namespace, pod_body("flaky", "Always"))
    pod = wait_for(lambda: read(core, namespace, "flaky"), STARTUP, "the container restarted after failed probes",
                   until=lambda p: (p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1)
    status = pod["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 143, status  # SIGTERM first, as a kubelet does
    assert pod["status"]["phase"] == "Running", pod["status"]
    found = wait_for(lambda: reasons(core, namespace, "flaky"), 10, "Unhealthy and Killing events",
                     until=lambda r: {"Unhealthy", "Killing"} <= set(r))
    assert found.count("Unhealthy") >= 2, found  # failureThreshold 2: two failures before the kill


def test_with_restart_policy_never_the_pod_fails(core, namespace):
    core.create_namespaced_pod(namespace, pod_body("once", "Never"))
    pod = wait_for(lambda: read(core, namespace, "once"), STARTUP, "the pod Failed after failed probes",
                   until=lambda p: p["status"].get("phase") == "Failed")
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0 and status["state"]["terminated"]["exitCode"] == 143, status
