"""Pure parts of the local cluster's additions: Service env vars, serving-cert SANs, add-on configs and objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import addons, components, containers, kueue_addon, pki, schedplugins_addon
from localcluster.layout import Endpoints, Layout

ROOT = Path(__file__).resolve().parents[2]


def _service(name: str, ip: str, *ports: dict) -> dict:
    return {"metadata": {"name": name}, "spec": {"clusterIP": ip, "ports": list(ports)}}


@pytest.mark.parametrize("services, expected", [
    ([_service("kubernetes", "10.96.0.1", {"name": "https", "port": 443, "protocol": "TCP"})], {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1"}),
    ([_service("my-svc", "10.96.3.4", {"port": 80}, {"name": "dns-udp", "port": 53, "protocol": "UDP"})], {
        "MY_SVC_SERVICE_HOST": "10.96.3.4", "MY_SVC_SERVICE_PORT": "80", "MY_SVC_SERVICE_PORT_DNS_UDP": "53",
        "MY_SVC_PORT": "tcp://10.96.3.4:80",
        "MY_SVC_PORT_80_TCP": "tcp://10.96.3.4:80", "MY_SVC_PORT_80_TCP_PROTO": "tcp",
        "MY_SVC_PORT_80_TCP_PORT": "80", "MY_SVC_PORT_80_TCP_ADDR": "10.96.3.4",
        "MY_SVC_PORT_53_UDP": "udp://10.96.3.4:53", "MY_SVC_PORT_53_UDP_PROTO": "udp",
        "MY_SVC_PORT_53_UDP_PORT": "53", "MY_SVC_PORT_53_UDP_ADDR": "10.96.3.4"}),
    ([_service("headless", "None", {"port": 80}), _service("pending", "", {"port": 80})], {}),
])
def test_service_env_is_what_a_kubelet_sets(services, expected):
    assert containers.service_env(services) == expected


def test_the_apiserver_certificate_covers_what_pods_and_this_host_dial():
    (apiserver,) = [cert for cert in pki.SERVING if cert.name == "apiserver"]
    for name in ("IP:127.0.0.1", "IP:10.96.0.1", "IP:10.244.0.1", "DNS:kubernetes.default.svc"):
        assert name in apiserver.sans


def test_a_serving_certificate_is_reissued_when_a_name_is_added(tmp_path):
    pki.ensure_pki(tmp_path)
    before = (tmp_path / "kueue-webhook.crt").read_bytes()
    pki.ensure_pki(tmp_path)
    assert (tmp_path / "kueue-webhook.crt").read_bytes() == before  # kept while it covers every name
    extra = pki.ServingCert("kueue-webhook", "kueue-webhook", ("localhost",), ("127.0.0.1", "10.244.0.1"))
    pki.issue_serving_cert(tmp_path, extra)
    assert "IP:10.244.0.1" in pki._sans_of(tmp_path / "kueue-webhook.crt")


def _bin_dir_of(tmp_path: Path, version: str) -> Path:
    """A bin dir whose kube-apiserver reports `version`, as the built one does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kube-apiserver").write_text(f"#!/bin/sh\necho 'Kubernetes {version}'\n")
    (bin_dir / "kube-apiserver").chmod(0o755)
    return bin_dir


def test_control_plane_flags_turn_on_the_workload_api_and_the_endpoint_reconciler(tmp_path):
    endpoints = Endpoints(Layout(tmp_path), {"apiserver": 6443, "etcd": 2379})
    argv = components.apiserver_argv(_bin_dir_of(tmp_path, "v1.36.3"), endpoints)
    assert "--feature-gates=GenericWorkload=true,GangScheduling=true" in argv
    assert "--runtime-config=scheduling.k8s.io/v1alpha2=true" in argv
    assert "--advertise-address=10.244.0.1" in argv and "--bind-address=0.0.0.0" in argv
    assert not any(arg.startswith("--endpoint-reconciler-type") for arg in argv)
    assert "--profiling=false" in argv  # Go's profiles only for `up --profiling`


def test_the_api_server_serves_profiles_only_when_asked(tmp_path):
    endpoints = Endpoints(Layout(tmp_path), {"apiserver": 6443, "etcd": 2379})
    argv = components.apiserver_argv(_bin_dir_of(tmp_path, "v1.36.3"), endpoints, profiling=True)
    assert "--profiling=true" in argv and "--profiling=false" not in argv


# Only 1.36 serves scheduling.k8s.io/v1alpha2, and each release refuses a gate or group version it does not know.
@pytest.mark.parametrize("version, workload_api", [
    ("v1.33.13", False), ("v1.34.4", False), ("v1.35.4", False), ("v1.36.3", True), ("v1.37.2", False),
])
def test_the_workload_api_is_asked_only_of_the_release_that_serves_it(tmp_path, version, workload_api):
    bin_dir = _bin_dir_of(tmp_path, version)
    endpoints = Endpoints(Layout(tmp_path), {"apiserver": 6443, "etcd": 2379, "controller-manager": 10257,
                                            "scheduler": 10259})
    for argv in (components.apiserver_argv(bin_dir, endpoints), components.controller_manager_argv(bin_dir, endpoints),
                 components.scheduler_argv(bin_dir, endpoints)):
        assert any(arg.startswith("--feature-gates=") for arg in argv) == workload_api, argv[0]
    apiserver = components.apiserver_argv(bin_dir, endpoints)
    assert any(arg.startswith("--runtime-config=") for arg in apiserver) == workload_api


def test_kueue_objects_call_its_webhooks_by_url(tmp_path):
    # A cluster's root of its own (the manifests of this checkout, a CA of its own): no cluster need have run here.
    (tmp_path / "localcluster").symlink_to(ROOT / "localcluster")
    (tmp_path / ".localcluster" / "pki").mkdir(parents=True)
    (tmp_path / ".localcluster" / "pki" / "ca.crt").write_text("a CA\n")
    endpoints = Endpoints(Layout(tmp_path), {"apiserver": 6443, "kueue-webhook": 9555, "kueue-health": 8555})
    converted = {crd["spec"]["names"]["plural"]: crd["spec"].get("conversion") for crd in kueue_addon.crds(endpoints)}
    assert len(converted) == 11
    assert {name for name, conversion in converted.items() if conversion} == kueue_addon.CONVERTED
    assert converted["workloads"]["webhook"]["clientConfig"]["url"] == "https://127.0.0.1:9555/convert"
    hooks = {hook["name"]: hook for config in kueue_addon.webhook_configurations(endpoints)
             for hook in config["webhooks"]}
    assert set(hooks) == {"mclusterqueue.kb.io", "mresourceflavor.kb.io", "mworkload.kb.io",
                          "vclusterqueue.kb.io", "vcohort.kb.io", "vresourceflavor.kb.io", "vworkload.kb.io"}
    assert hooks["vworkload.kb.io"]["clientConfig"]["url"] == \
        "https://127.0.0.1:9555/validate-kueue-x-k8s-io-v1beta2-workload"
    assert all(hook["failurePolicy"] == "Fail" and hook["clientConfig"]["caBundle"] for hook in hooks.values())


def test_kueue_configuration_serves_webhooks_on_loopback_without_pod_integration(tmp_path):
    config = kueue_addon.config({"kueue-webhook": 9555, "kueue-health": 8555}, tmp_path)
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9555, "certDir": str(tmp_path)}
    assert config["internalCertManagement"] == {"enable": False}
    assert "pod" not in config["integrations"]["frameworks"]
    assert config["featureGates"]["VisibilityOnDemand"] is False


def test_cluster_queue_shape():
    queue = kueue_addon.cluster_queue("q", "24", "48Gi", namespaces=["ns-a"])
    assert queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert queue["spec"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["ns-a"]
    (group,) = queue["spec"]["resourceGroups"]
    assert group["flavors"] == [{"name": "default-flavor", "resources": [
        {"name": "cpu", "nominalQuota": "24"}, {"name": "memory", "nominalQuota": "48Gi"}]}]
    assert kueue_addon.cluster_queue("q", "1", "1Gi")["spec"]["namespaceSelector"] == {}


def test_scheduler_plugins_profile_is_coscheduling_under_its_own_name(tmp_path):
    config = schedplugins_addon.config(tmp_path / "k.yaml")
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == schedplugins_addon.SCHEDULER_NAME
    assert {"name": "Coscheduling"} in profile["plugins"]["multiPoint"]["enabled"]
    assert config["clientConnection"]["kubeconfig"] == str(tmp_path / "k.yaml")


def test_unknown_addons_are_refused_and_known_ones_come_in_start_order():
    assert addons.check_names(["kueue", "scheduler-plugins", "kueue"]) == ["scheduler-plugins", "kueue"]
    with pytest.raises(RuntimeError, match="unknown add-on"):
        addons.check_names(["volcano"])
