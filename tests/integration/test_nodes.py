"""The local nodes behave as kubelets and kube-proxy would: pods run as process trees with their own network
namespace, report status, honour restart policies and deletion, Services forward, and faults act like real ones.

These need the local cluster with its node agent (`localcluster up`); on another cluster they are skipped.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers import wait_for
from localcluster import faults, podlogs

STARTUP = 60  # a pod that imports torch on a busy 2-core machine can take a while

pytestmark = pytest.mark.process_nodes


@pytest.fixture
def core(kube) -> client.CoreV1Api:
    return client.CoreV1Api(kube)


@pytest.fixture
def state_dir(cluster) -> Path:
    if cluster.kind != "local" or cluster.node_kind != "process":
        pytest.skip("tests the local cluster's process-backed node agent (make test-process-nodes)")
    return Path(cluster.kubeconfig).parent


def pod_body(name: str, command: list[str], restart: str = "Never", **spec) -> dict:
    container = {"name": "main", "image": "local", "command": command}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
            "spec": {"restartPolicy": restart, "containers": [container], **spec}}


def python(code: str) -> list[str]:
    return ["python", "-c", code]


def create(core, namespace: str, body: dict) -> dict:
    core.create_namespaced_pod(namespace, body)
    return body


def read(core, namespace: str, name: str) -> dict:
    return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))


def wait_phase(core, namespace: str, name: str, phases: tuple[str, ...], timeout: float = STARTUP) -> dict:
    return wait_for(lambda: read(core, namespace, name), timeout, f"pod {namespace}/{name} in {phases}",
                    until=lambda p: p.get("status", {}).get("phase") in phases)


def wait_ready(core, namespace: str, name: str) -> dict:
    return wait_for(lambda: read(core, namespace, name), STARTUP, f"pod {namespace}/{name} to be Ready",
                    until=lambda p: any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p["status"].get("conditions") or []))


def main_status(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]


def gone(core, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        return err.status == 404
    return False


def container_pid(state_dir: Path, namespace: str, name: str) -> int:
    pid_file = podlogs.find_pod_dir(state_dir, namespace, name) / "main.pid"
    return int(pid_file.read_text().split()[0])


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def service(core, namespace: str, name: str, port: int, target: int) -> str:
    core.create_namespaced_service(namespace, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": target}]}})
    return core.read_namespaced_service(name, namespace).spec.cluster_ip


def test_pod_runs_with_downward_env_and_succeeds(core, namespace, state_dir):
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "GREETING", "value": "hi-$(POD_NAME)"}]
    code = "import os, socket; print(os.environ['POD_IP'], os.environ['GREETING'], socket.gethostname())"
    create(core, namespace, pod_body("env", python(code), container={"env": env}))
    pod = wait_phase(core, namespace, "env", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    term = main_status(pod)["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    pod_ip = pod["status"]["podIP"]
    assert pod_ip.startswith("10.244.") and pod["status"]["hostIP"]
    assert podlogs.read(state_dir, namespace, "env").split() == [pod_ip, "hi-env", "env"]


def test_exit_code_and_termination_message(core, namespace, state_dir):
    code = "open('/dev/termination-log', 'w').write('bad input'); raise SystemExit(3)"
    create(core, namespace, pod_body("exit3", python(code)))
    create(core, namespace, pod_body("fallback", ["sh", "-c", "echo last words; exit 4"],
                                     container={"terminationMessagePolicy": "FallbackToLogsOnError"}))
    for name, exit_code, message in (("exit3", 3, "bad input"), ("fallback", 4, "last words")):
        pod = wait_phase(core, namespace, name, ("Succeeded", "Failed"))
        term = main_status(pod)["state"]["terminated"]
        assert pod["status"]["phase"] == "Failed"
        assert (term["exitCode"], term["reason"], term.get("message", "").strip()) == (exit_code, "Error", message)


def test_init_containers_run_first_and_share_an_empty_dir(core, namespace, state_dir):
    body = pod_body("init", ["sh", "-c", "cat /shared/a /shared/b"],
                    container={"volumeMounts": [{"name": "shared", "mountPath": "/shared"}]},
                    volumes=[{"name": "shared", "emptyDir": {}}])
    body["spec"]["initContainers"] = [
        {"name": f"init-{x}", "image": "local", "command": ["sh", "-c", f"echo {x} > /shared/{x}"],
         "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]} for x in ("a", "b")]
    create(core, namespace, body)
    pod = wait_phase(core, namespace, "init", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert [s["state"]["terminated"]["exitCode"] for s in pod["status"]["initContainerStatuses"]] == [0, 0]
    assert podlogs.read(state_dir, namespace, "init").split() == ["a", "b"]


def test_on_failure_restarts_with_a_restart_count(core, namespace, state_dir):
    create(core, namespace, pod_body("flaky", ["sh", "-c", "exit 1"], restart="OnFailure"))
    pod = wait_for(lambda: read(core, namespace, "flaky"), STARTUP, "a restarted container",
                   until=lambda p: (p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 2)
    last = main_status(pod)["lastState"]["terminated"]
    assert last["exitCode"] == 1 and pod["status"]["phase"] == "Running"


def test_kill_pod_fault_crashes_the_whole_tree(core, namespace, state_dir):
    create(core, namespace, pod_body("victim", ["sh", "-c", "sleep 600 & sleep 600"], restart="Always"))
    wait_phase(core, namespace, "victim", ("Running",))
    pid = container_pid(state_dir, namespace, "victim")
    assert faults.kill_pod(namespace, "victim", signal.SIGKILL, state_dir) == 1
    pod = wait_for(lambda: read(core, namespace, "victim"), 30, "the killed container restarted",
                   until=lambda p: main_status(p).get("restartCount") == 1 and "running" in main_status(p)["state"])
    assert main_status(pod)["lastState"]["terminated"]["exitCode"] == 137
    assert not alive(pid)


def test_graceful_delete_sends_sigterm_first(core, namespace, state_dir):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(0)))\n"
            "print('up', flush=True)\ntime.sleep(600)")
    create(core, namespace, pod_body("polite", python(code), terminationGracePeriodSeconds=30))
    wait_for(lambda: podlogs.read(state_dir, namespace, "polite"), STARTUP, "the pod to print 'up'",
             until=lambda text: "up" in text, ignore=(FileNotFoundError,))
    started = time.monotonic()
    core.delete_namespaced_pod("polite", namespace)
    wait_for(lambda: gone(core, namespace, "polite"), 20, "the pod object to go")
    assert time.monotonic() - started < 20, "the agent waited for the grace period although the pod exited"
    assert "got TERM" in podlogs.read(state_dir, namespace, "polite")


def test_grace_period_ends_with_sigkill(core, namespace, state_dir):
    # A PID 1 without a SIGTERM handler ignores SIGTERM, as in a container.
    create(core, namespace, pod_body("stubborn", ["sleep", "600"], terminationGracePeriodSeconds=2))
    wait_phase(core, namespace, "stubborn", ("Running",))
    pid = container_pid(state_dir, namespace, "stubborn")
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace)
    wait_for(lambda: gone(core, namespace, "stubborn"), 20, "the pod object to go")
    assert 2 <= time.monotonic() - started < 15
    assert not alive(pid)


def test_force_delete_kills_at_once(core, namespace, state_dir):
    create(core, namespace, pod_body("forced", ["sleep", "600"], terminationGracePeriodSeconds=300))
    wait_phase(core, namespace, "forced", ("Running",))
    pid = container_pid(state_dir, namespace, "forced")
    core.delete_namespaced_pod("forced", namespace, grace_period_seconds=0)
    wait_for(lambda: not alive(pid), 5, f"container pid {pid} to die")


def test_service_cluster_ip_reaches_a_pod_from_host_and_pods(core, namespace, state_dir):
    create(core, namespace, pod_body("web", ["python", "-m", "http.server", "8000"], restart="Always",
                                     container={"readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}))
    ip = service(core, namespace, "web", 80, 8000)
    wait_ready(core, namespace, "web")
    discovery = client.DiscoveryV1Api(core.api_client)
    wait_for(lambda: discovery.list_namespaced_endpoint_slice(namespace).items, 30, "a ready endpoint for web",
             until=lambda slices: any(e.conditions.ready for s in slices for e in s.endpoints or []))

    def fetch() -> int:
        with urllib.request.urlopen(f"http://{ip}/", timeout=2) as resp:
            return resp.status

    assert wait_for(fetch, 30, f"HTTP 200 from {ip}:80", until=lambda s: s == 200, ignore=(OSError,)) == 200
    code = f"import urllib.request; print(urllib.request.urlopen('http://{ip}/', timeout=5).status)"
    create(core, namespace, pod_body("client", python(code), labels={"app": "client"}))
    pod = wait_phase(core, namespace, "client", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", podlogs.read(state_dir, namespace, "client")
    assert podlogs.read(state_dir, namespace, "client").strip() == "200"


def test_tcpstore_behind_a_cluster_ip(core, namespace, state_dir):
    server = ("import time, torch.distributed as d\n"
              "s = d.TCPStore('0.0.0.0', 29400, is_master=True, wait_for_workers=False, multi_tenant=True)\n"
              "print('serving', flush=True)\ntime.sleep(600)")
    create(core, namespace, pod_body("store", python(server), restart="Always",
                                     container={"readinessProbe": {"tcpSocket": {"port": 29400}, "periodSeconds": 1}}))
    ip = service(core, namespace, "store", 29400, 29400)
    wait_ready(core, namespace, "store")
    client_code = ("import datetime, torch.distributed as d\n"
                   f"s = d.TCPStore('{ip}', 29400, is_master=False, timeout=datetime.timedelta(seconds=20))\n"
                   "s.set('k', 'v'); print(s.get('k').decode())")
    create(core, namespace, pod_body("store-client", python(client_code), labels={"app": "store-client"}))
    pod = wait_phase(core, namespace, "store-client", ("Succeeded", "Failed"), timeout=90)
    logs = podlogs.read(state_dir, namespace, "store-client")
    assert pod["status"]["phase"] == "Succeeded", logs
    assert logs.strip().splitlines()[-1] == "v"


def node_ready(core, node: str) -> str:
    conditions = core.read_node(node).status.conditions or []
    return next((c.status for c in conditions if c.type == "Ready"), "missing")


def test_node_loss_makes_the_node_not_ready(core, namespace, state_dir, cluster):
    node = f"local-node-{(cluster.nodes or 1) - 1}"
    create(core, namespace, pod_body("doomed", ["sleep", "600"], nodeName=node))
    wait_phase(core, namespace, "doomed", ("Running",))
    pid = container_pid(state_dir, namespace, "doomed")
    started = time.monotonic()
    try:
        faults.node_loss(node, state_dir)
        wait_for(lambda: not alive(pid), 5, "the lost node's container to die")
        wait_for(lambda: node_ready(core, node), 40, f"{node} to leave Ready", until=lambda s: s != "True")
        lost_after = time.monotonic() - started
        # A dead kubelet reports nothing: the pod object still says Running.
        assert read(core, namespace, "doomed")["status"]["phase"] == "Running"
    finally:
        faults.restore_node(node, state_dir)
    wait_for(lambda: node_ready(core, node), 30, f"{node} Ready again", until=lambda s: s == "True")
    assert lost_after < 40


def test_drain_evicts_and_cordons(core, namespace, state_dir, cluster):
    node = "local-node-0"
    create(core, namespace, pod_body("evictee", ["sleep", "600"], nodeName=node, terminationGracePeriodSeconds=1))
    wait_phase(core, namespace, "evictee", ("Running",))
    try:
        evicted = faults.drain(core, node, namespace=namespace)
        assert f"{namespace}/evictee" in evicted
        assert core.read_node(node).spec.unschedulable is True
        wait_for(lambda: gone(core, namespace, "evictee"), 20, "the evicted pod to go")
    finally:
        faults.cordon(core, node, False)


def test_cluster_ip_port_is_closed_without_ready_endpoints(core, namespace, state_dir):
    ip = service(core, namespace, "nobody", 8080, 8080)

    def refused() -> bool:
        try:
            with socket.create_connection((ip, 8080), timeout=2) as s:
                s.settimeout(2)
                return s.recv(1) == b""  # the proxy accepts and closes at once
        except OSError:
            return True

    assert wait_for(refused, 10, f"{ip}:8080 to refuse or close")


def test_logs_through_the_apiserver_and_the_state_dir(core, namespace, state_dir):
    create(core, namespace, pod_body("talker", ["sh", "-c", "echo one; echo two"]))
    wait_phase(core, namespace, "talker", ("Succeeded",))
    assert core.read_namespaced_pod_log("talker", namespace) == "one\ntwo\n"  # served by the node's kubelet API
    assert core.read_namespaced_pod_log("talker", namespace, tail_lines=1) == "two\n"
    assert podlogs.read(state_dir, namespace, "talker", "main") == "one\ntwo\n"


def test_config_map_as_env_and_volume(core, namespace, state_dir):
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}})
    body = pod_body("configured", ["sh", "-c", "echo $MODE; cat /etc/settings/mode"],
                    container={"env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings",
                                                                                          "key": "mode"}}}],
                               "volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}]},
                    volumes=[{"name": "settings", "configMap": {"name": "settings"}}])
    create(core, namespace, body)
    pod = wait_phase(core, namespace, "configured", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", podlogs.read(state_dir, namespace, "configured")
    assert podlogs.read(state_dir, namespace, "configured").split() == ["fast", "fast"]


CLEANUP_SCENARIO = r"""
import json, subprocess, sys, time
from pathlib import Path
from localcluster import launcher, network, state
state_dir = Path(sys.argv[1])
network.ensure_bridge()
ip = network.Ipam(state_dir).allocate("uid-1")
ns = network.create_netns("uid-1", ip)
network.LoopbackIps(state_dir).add("10.96.7.7")
pod_dir = state.pod_dir(state_dir, "ns", "p", "uid-1")
pod_dir.mkdir(parents=True)
state.write_json(state.runtime_file(pod_dir), {"namespace": "ns", "name": "p", "uid": "uid-1", "node": "n",
                                               "netns": ns, "ip": ip, "containers": ["c"]})
pod = {"metadata": {"name": "p"}, "spec": {}}
proc = launcher.launch(pod, {"name": "c", "command": ["sleep", "600"]}, launcher.Sandbox(pod_dir, ns, ip),
                       {"PATH": "/usr/bin:/bin"}, {}, Path("/"), False)
pid = proc.host_pid()
subprocess.run([sys.executable, "-m", "localcluster.nodeagent", "--cleanup", "--state-dir", str(state_dir)],
               check=True)
proc.proc.wait(timeout=10)
print(json.dumps({"pid_alive": Path(f"/proc/{pid}").exists(), "netns": network.list_netns(),
                  "bridge": network.link_exists(state.BRIDGE),
                  "lo": "10.96.7.7" in network.sh("ip", "addr", "show", "lo").stdout}))
"""


def test_cleanup_removes_processes_netns_bridge_and_cluster_ips(tmp_path):
    """Run in fresh network, PID and mount namespaces so the real cluster's pods and bridge are untouched."""
    import json
    import subprocess
    import sys

    script = tmp_path / "scenario.py"
    script.write_text(CLEANUP_SCENARIO)
    isolated = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--mount", "sh", "-c",
                'mount -t tmpfs none /run/netns 2>/dev/null || { mkdir -p /run/netns && '
                'mount -t tmpfs none /run/netns; }; exec "$0" "$@"', sys.executable, str(script), str(tmp_path / "s")]
    result = subprocess.run(isolated, capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "pid_alive": False, "netns": [], "bridge": False, "lo": False}


def test_image_workspace_and_host_path_directory_or_create(core, namespace, state_dir, tmp_path):
    host_dir = tmp_path / "made" / "here"
    body = pod_body("workspace", ["sh", "-c", "pwd; test -f localcluster/build.sh && echo repo; echo hi > /out/f"],
                    container={"workingDir": "/workspace", "volumeMounts": [{"name": "out", "mountPath": "/out"}]},
                    volumes=[{"name": "out", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}}])
    create(core, namespace, body)
    pod = wait_phase(core, namespace, "workspace", ("Succeeded", "Failed"))
    logs = podlogs.read(state_dir, namespace, "workspace")
    assert pod["status"]["phase"] == "Succeeded", logs
    assert logs.split() == ["/workspace", "repo"]
    assert (host_dir / "f").read_text() == "hi\n"


def test_exec_readiness_probe_runs_inside_the_container(core, namespace, state_dir):
    # The probe sees the container's hostname, so it runs in the container's namespaces.
    probe = {"exec": {"command": ["sh", "-c", "test $(hostname) = probed"]}, "periodSeconds": 1}
    create(core, namespace, pod_body("probed", ["sleep", "600"], restart="Always",
                                     container={"readinessProbe": probe}))
    wait_ready(core, namespace, "probed")
