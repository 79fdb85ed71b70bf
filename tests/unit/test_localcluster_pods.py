"""Pure parts of the local nodes: container env and command, pod phase and conditions, IPAM, proxy tables."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from localcluster import containers, network, podstatus, probes, proxy, state
from localcluster.podstatus import ContainerRecord

POD = {
    "metadata": {"name": "w-0", "namespace": "ns", "uid": "u-1", "labels": {"role": "worker"},
             "annotations": {"a": "b"}},
    "spec": {"nodeName": "local-node-1", "containers": []},
    "status": {"podIP": "10.244.0.9", "hostIP": "10.244.0.1"},
}


def no_lookup(kind, ns, name, key):
    return {"configmap": {"cm": {"k": "from-cm"}}, "secret": {"s": {"k": "from-secret"}}}[kind].get(name, {}).get(key) \
        if key else {"X": "1"}


@pytest.mark.parametrize("text, env, expected", [
    ("--addr=$(POD_IP)", {"POD_IP": "1.2.3.4"}, "--addr=1.2.3.4"),
    ("$(MISSING)", {}, "$(MISSING)"),
    ("$$(POD_IP)", {"POD_IP": "x"}, "$(POD_IP)"),
    ("a$(A)b$(B)", {"A": "1", "B": "2"}, "a1b2"),
])
def test_expand_follows_kubernetes_rules(text, env, expected):
    assert containers.expand(text, env) == expected


@pytest.mark.parametrize("path, expected", [
    ("metadata.name", "w-0"), ("metadata.namespace", "ns"), ("metadata.uid", "u-1"),
    ("status.podIP", "10.244.0.9"), ("spec.nodeName", "local-node-1"),
    ("metadata.labels['role']", "worker"), ("metadata.annotations['a']", "b"), ("metadata.labels['none']", ""),
])
def test_field_refs(path, expected):
    assert containers.field_value(POD, path) == expected


def test_env_resolution_covers_every_source():
    container = {"name": "c", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}},
                 "envFrom": [{"configMapRef": {"name": "all"}, "prefix": "P_"}],
                 "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "ADDR", "value": "$(IP):29400"},
                         {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                         {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                               "divisor": "1Mi"}}},
                         {"name": "NODE_MEM", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory",
                                                                                 "divisor": "0"}}},
                         {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                         {"name": "SEC", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    env = containers.resolve_env(POD, container, no_lookup, {"memory": "16Gi"})
    assert env == {"P_X": "1", "IP": "10.244.0.9", "ADDR": "10.244.0.9:29400", "CPU": "2", "MEM_MI": "1024",
                   "NODE_MEM": str(1 << 30), "CM": "from-cm", "SEC": "from-secret"}


def test_missing_key_is_an_error_unless_optional():
    missing = {"name": "M", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}
    with pytest.raises(LookupError):
        containers.resolve_env(POD, {"name": "c", "env": [missing]}, no_lookup, {})
    missing["valueFrom"]["configMapKeyRef"]["optional"] = True
    assert containers.resolve_env(POD, {"name": "c", "env": [missing]}, no_lookup, {}) == {"M": ""}


@pytest.mark.parametrize("container, expected", [
    ({"name": "c", "command": ["torchrun"], "args": ["--local-addr=$(IP)", "train.py"]},
     ["torchrun", "--local-addr=1.1.1.1", "train.py"]),
    ({"name": "c", "args": ["python", "x.py"]}, ["python", "x.py"]),
])
def test_command_line(container, expected):
    assert containers.command_line(container, {"IP": "1.1.1.1"}) == expected


def test_command_line_needs_a_command():
    with pytest.raises(ValueError):
        containers.command_line({"name": "c"}, {})


def test_mounts_include_volumes_termination_log_hosts_and_resolv_conf(tmp_path):
    spec = {"name": "c", "terminationMessagePath": "/tmp/msg",
            "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "x", "readOnly": True}]}
    result = containers.mounts(spec, {"data": "/host/data"}, tmp_path / "term", tmp_path / "hosts", Path("/repo"))
    assert result == [{"source": "/repo", "target": "/workspace"},
                      {"source": "/host/data/x", "target": "/data", "readOnly": True},
                      {"source": str(tmp_path / "term"), "target": "/tmp/msg", "file": True},
                      {"source": str(tmp_path / "hosts"), "target": "/etc/hosts", "file": True},
                      {"source": str(tmp_path / "resolv.conf"), "target": "/etc/resolv.conf", "file": True}]
    with pytest.raises(ValueError):
        containers.mounts(spec, {}, tmp_path / "term", tmp_path / "hosts")


@pytest.mark.parametrize("policy, file_text, code, expected", [
    ("File", "boom", 1, "boom"),
    ("File", "", 1, ""),
    ("FallbackToLogsOnError", "", 1, "line1\nline2"),
    ("FallbackToLogsOnError", "", 0, ""),
    ("FallbackToLogsOnError", "from file", 1, "from file"),
])
def test_termination_message(policy, file_text, code, expected):
    container = {"terminationMessagePolicy": policy}
    assert containers.termination_message(container, file_text, "line1\nline2\n", code) == expected


def rec(state: str, code: int | None = None, last: bool = False, init: bool = False) -> ContainerRecord:
    r = ContainerRecord("c", "img", init=init)
    r.state = {"running": {"startedAt": "t"}} if state == "running" else (
        podstatus.terminated(code, "t") if state == "terminated" else {"waiting": {"reason": "X"}})
    r.last_state = {"terminated": {"exitCode": 1}} if last else {}
    return r


@pytest.mark.parametrize("policy, inits, mains, phase", [
    ("Never", [], [rec("waiting")], "Pending"),
    ("Never", [], [rec("running")], "Running"),
    ("Never", [], [rec("terminated", 0), rec("terminated", 0)], "Succeeded"),
    ("Never", [], [rec("terminated", 0), rec("terminated", 2)], "Failed"),
    ("Never", [], [rec("terminated", 0), rec("running")], "Running"),
    ("OnFailure", [], [rec("waiting", last=True)], "Running"),
    ("OnFailure", [], [rec("terminated", 0)], "Succeeded"),
    ("Always", [], [rec("terminated", 0)], "Running"),
    ("Never", [rec("terminated", 1, init=True)], [rec("waiting")], "Failed"),
    ("OnFailure", [rec("terminated", 1, init=True)], [rec("waiting")], "Pending"),
    ("Always", [rec("terminated", 0, init=True), rec("running", init=True)], [rec("waiting")], "Pending"),
])
def test_pod_phase(policy, inits, mains, phase):
    assert podstatus.pod_phase(policy, inits, mains) == phase


@pytest.mark.parametrize("policy, code, restart", [
    ("Always", 0, True), ("Always", 1, True), ("OnFailure", 0, False), ("OnFailure", 137, True),
    ("Never", 1, False),
])
def test_should_restart(policy, code, restart):
    assert podstatus.should_restart(policy, code) is restart


def test_signal_exit_records_the_signal():
    term = podstatus.terminated(137, "t")["terminated"]
    assert (term["exitCode"], term["signal"], term["reason"]) == (137, 9, "Error")


def test_conditions_keep_transition_time_while_status_holds():
    first = podstatus.conditions([], {"Ready": (False, "ContainersNotReady")})
    first[0]["lastTransitionTime"] = "earlier"
    same = podstatus.conditions(first, {"Ready": (False, "ContainersNotReady")})
    flipped = podstatus.conditions(first, {"Ready": (True, "")})
    assert same[0]["lastTransitionTime"] == "earlier"
    assert flipped[0]["lastTransitionTime"] != "earlier" and flipped[0]["status"] == "True"


def test_terminal_pod_is_not_ready():
    wanted = podstatus.wanted_conditions("Succeeded", True, True, [rec("terminated", 0)])
    assert wanted["Ready"] == (False, "PodCompleted") and wanted["PodReadyToStartContainers"][0] is False


def test_recovered_running_container_is_reported_unknown():
    r = ContainerRecord("c", "img")
    podstatus.recover(r, {"restartCount": 2, "state": {"running": {"startedAt": "t"}}, "lastState": {}})
    assert r.restart_count == 2
    assert r.state["terminated"]["reason"] == "ContainerStatusUnknown" and r.exit_code == 137


def test_ipam_is_stable_per_uid_and_persisted(tmp_path):
    ipam = network.Ipam(tmp_path)
    a, b = ipam.allocate("a"), ipam.allocate("b")
    assert a != b and state.BRIDGE_IP not in (a, b)
    assert network.Ipam(tmp_path).allocate("a") == a  # a restarted agent keeps the address
    ipam.release("a")
    assert ipam.allocate("c") == a
    ipam.keep_only({"c"})
    assert state.read_json(state.ipam_file(tmp_path), {}) == {a: "c"}


def test_netns_and_veth_names_fit_interface_limits():
    assert len("v" + state.netns_name("0123456789abcdef-0123")) <= 15


def test_service_ports_skip_headless_and_udp():
    svc = {"spec": {"clusterIP": "10.96.0.5", "ports": [{"name": "c10d", "port": 29400},
                                                          {"name": "dns", "port": 53, "protocol": "UDP"}]}}
    assert proxy.service_ports(svc) == [("10.96.0.5", 29400, "c10d")]
    assert proxy.service_ports({"spec": {"clusterIP": "None", "ports": [{"port": 1}]}}) == []


def test_slice_backends_keep_ready_endpoints():
    sl = {"ports": [{"name": "c10d", "port": 29400, "protocol": "TCP"}],
          "endpoints": [{"addresses": ["10.244.0.2"], "conditions": {"ready": True}},
                        {"addresses": ["10.244.0.3"], "conditions": {"ready": False}},
                        {"addresses": ["10.244.0.4"], "conditions": {}}]}
    assert proxy.slice_backends(sl) == {"c10d": [("10.244.0.2", 29400), ("10.244.0.4", 29400)]}


def _slice(ns: str, service: str, *nodes: str | None) -> dict:
    return {"metadata": {"namespace": ns, "labels": {proxy.SERVICE_LABEL: service}},
            "endpoints": [{"addresses": ["10.244.0.9"], "nodeName": node} for node in nodes]}


def test_services_served_only_by_fake_nodes_get_no_listener():
    slices = [_slice("a", "kwok-only", "kwok-1", "kwok-2"), _slice("a", "mixed", "kwok-1"),
              _slice("a", "mixed", "local-node-0"), _slice("a", "real", "local-node-1"),
              _slice("a", "no-endpoints"), _slice("a", "unplaced", None), _slice("b", "kwok-only", "local-node-0")]
    assert proxy.elsewhere(slices, {"local-node-0", "local-node-1"}) == {("a", "kwok-only")}


def test_readiness_thresholds():
    r = probes.Readiness({"tcpSocket": {"port": 1}, "failureThreshold": 2})
    assert not r.ready
    assert r.record(True) and r.ready
    assert not r.record(False) and r.ready
    assert r.record(False) and not r.ready
    assert probes.Readiness(None).ready


def test_named_probe_port():
    assert probes.resolve_port("c10d", {"ports": [{"name": "c10d", "containerPort": 29400}]}) == 29400
    assert probes.resolve_port(8080, {}) == 8080


def test_grace_period_counts_from_the_deletion_timestamp():
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert 25 < podstatus.seconds_until(soon) <= 30
    assert podstatus.seconds_until("2020-01-01T00:00:00Z") == 0
