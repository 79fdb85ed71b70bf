"""The operator's Helm chart through its whole life on a cluster, with real Helm (helm-python-sdk) and a job
training all along: install, the liveness probe doing its job, metrics scraped through the Service, an upgrade
that rolls the Deployment, and an uninstall, checked against what docs/operations.md says happens then.

The local cluster ignores images: the node agent runs what images/operator.Dockerfile's ENTRYPOINT declares
(`elasticjob run`) with the Deployment's args (localcluster/images.py). Slow: about 3 minutes, most of it the
liveness probe's own timing (20 s period, 3 failures, 30 s grace), which the test leaves as the chart has it.
"""

from __future__ import annotations

import re
import secrets
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_support import Progress, job_manifest, train_args
from helpers import wait_for

pytestmark = pytest.mark.slow
START_TIMEOUT = 120
LIVENESS_TIMEOUT = 150  # 3 failed probes 20 s apart, 30 s of grace, the restart
STEP_SECONDS = 0.5


@pytest.fixture
def release(cluster, kube, namespace):
    """A release of the chart in the test's namespace, watching only it; uninstalled at the end if still there."""
    if cluster.kind != "local":
        pytest.skip("kind installs the chart in tests/e2e/kind/up.sh; this test injects faults through localcluster")
    from chart_operator import published_chart
    from localcluster import operatorchart

    name = f"ej-{secrets.token_hex(3)}"
    # The chart and the operator image from the local registry, with its pull secret (the namespace fixture made
    # it), where one runs (real nodes; the node agent ignores images).
    # One replica: the test stops, restarts and reads the log of the one operator pod (two: test_leader_election).
    chart = published_chart()
    values = {"watch": {"allNamespaces": False, "namespaces": [namespace]}, "replicas": 1,
              **(operatorchart.registry_values() if chart else {})}
    yield lambda extra=None: operatorchart.install_or_upgrade(cluster.kubeconfig, {**values, **(extra or {})},
                                                              release=name, namespace=namespace, chart=chart)
    import helm_python as helm

    with helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=namespace) as cfg:
        cfg.uninstall(name, ignore_not_found=True)


def exists(read, *args) -> bool:
    try:
        read(*args)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def operator_log(core: client.CoreV1Api, pod: client.V1Pod) -> str:
    return core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace)


def scrape(core: client.CoreV1Api, namespace: str, service: str) -> str:
    """GET /metrics through the Service's ClusterIP (the node proxy forwards it to the operator pod)."""
    svc = core.read_namespaced_service(service, namespace)
    port = svc.spec.ports[0].port
    with urllib.request.urlopen(f"http://{svc.spec.cluster_ip}:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def steps_after(progress, when: float, count: int = 3) -> Progress:
    return wait_for(progress, 60, f"{count} training steps after {time.strftime('%H:%M:%S', time.localtime(when))}",
                    until=lambda p: len({r["step"] for r in p.after(when)}) >= count)


def test_install_liveness_upgrade_uninstall(cluster, kube, jobs, progress, release):
    from localcluster import faults, operatorchart

    core, apps, rbac = client.CoreV1Api(kube), client.AppsV1Api(kube), client.RbacAuthorizationV1Api(kube)
    ext = client.ApiextensionsV1Api(kube)
    ns, state_dir = jobs.namespace, Path(cluster.kubeconfig).parent
    crd_names = [doc["metadata"]["name"] for doc in operatorchart.chart_crds()]
    crds_before = {name for name in crd_names if exists(ext.read_custom_resource_definition, name)}

    # --- install: every object from the chart, the operator running from its Deployment ---------------------
    installed = release()
    assert installed.installed and installed.revision == 1
    full = installed.fullname
    assert all(exists(ext.read_custom_resource_definition, name) for name in crd_names)
    for read, args in ((core.read_namespaced_service_account, (full, ns)), (core.read_namespaced_secret,
                       (f"{full}-rendezvous-key", ns)), (core.read_namespaced_service, (f"{full}-metrics", ns)),
                       (rbac.read_cluster_role, (f"{full}-framework",)), (rbac.read_namespaced_role, (full, ns))):
        assert exists(read, *args), f"{read.__name__}{args} missing after helm install"
    pod = operatorchart.wait_running(core, installed)
    (container,) = pod.spec.containers
    assert container.command is None and container.args[:2] == ["--namespace", ns]  # the image's ENTRYPOINT runs
    wait_for(lambda: operator_log(core, pod), 60, "the operator's watches synced",
             until=lambda log: "watches synced" in log)

    jobs.create(job_manifest(ns, train_args=train_args(1000, step_seconds=STEP_SECONDS)))
    wait_for(progress, START_TIMEOUT, "training at world size 2",
             until=lambda p: any(r["world_size"] == 2 for r in p.records))
    workers = {p.metadata.name: p.metadata.uid for p in jobs.worker_pods()}

    # --- metrics through the Service's ClusterIP -------------------------------------------------------------
    text = wait_for(lambda: scrape(core, ns, f"{full}-metrics"), 30, "the job's phase in the metrics",
                    until=lambda t: f'namespace="{ns}"' in t and 'phase="Running"' in t)
    for name in ("elasticjob_reconciles_total", "elasticjob_reconcile_seconds_bucket", "elasticjob_actions_total",
                 "elasticjob_job_phase"):
        assert re.search(rf"^{name}[{{ ]", text, re.M), f"{name} not scraped:\n{text[:2000]}"

    # --- liveness: /healthz answers the probe; a hung operator is restarted by it ----------------------------
    health = container.liveness_probe.http_get
    assert (health.path, health.port) == ("/healthz", "health")
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/healthz", timeout=5) as resp:
        assert resp.status == 200
    age = time.time() - pod.status.start_time.timestamp()
    wait_for(lambda: time.time() - pod.status.start_time.timestamp(), 60, "two liveness periods",
             until=lambda a: a > container.liveness_probe.initial_delay_seconds + container.liveness_probe.period_seconds)
    stopped_at = time.time()
    assert faults.kill_pod(ns, pod.metadata.name, signal.SIGSTOP, state_dir), "the operator has no process to stop"
    restarted = wait_for(lambda: core.read_namespaced_pod(pod.metadata.name, ns), LIVENESS_TIMEOUT,
                         "the liveness probe to restart the stopped operator",
                         until=lambda p: (p.status.container_statuses[0].restart_count or 0) >= 1)
    last = restarted.status.container_statuses[0].last_state.terminated
    assert last.exit_code == 137, last  # SIGTERM stays pending in a stopped process: SIGKILL after the grace period
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod.metadata.name}").items
    unhealthy = [e for e in events if e.reason == "Unhealthy"]
    # A real kubelet folds repeats into one Event with a count; the node agent posted one per failure.
    failed_probes = sum(e.count or 1 for e in unhealthy)
    assert failed_probes >= 3 and all("Liveness probe failed" in e.message for e in unhealthy), events
    assert all(e.last_timestamp.timestamp() >= int(stopped_at) for e in unhealthy), (
        f"the probe failed before the operator was stopped (it was up {age:.0f}s): {unhealthy}")
    assert "Killing" in {e.reason for e in events}
    steps_after(progress, stopped_at)

    # --- upgrade: a changed value rolls the Deployment; the job trains on, untouched -------------------------
    upgrade_at = time.time()
    upgraded = release({"logLevel": "debug"})
    assert not upgraded.installed and upgraded.revision == 2
    new_pod = operatorchart.wait_running(core, upgraded)
    assert new_pod.metadata.uid != pod.metadata.uid and "--verbose" in new_pod.spec.containers[0].args
    deployment = apps.read_namespaced_deployment(full, ns)
    # The new pod started before the old one stopped (it waited on the Lease the old one released).
    assert deployment.spec.strategy.rolling_update.max_unavailable == 0 and deployment.status.updated_replicas == 1
    steps_after(progress, upgrade_at)
    assert {p.metadata.name: p.metadata.uid for p in jobs.worker_pods()} == workers, "a worker was replaced"
    wait_for(lambda: operator_log(core, new_pod), 60, "the new operator's watches synced",
             until=lambda log: "watches synced: 1 jobs" in log)
    scaled_at = time.time()
    jobs.scale(3)  # the new operator acts on the running job
    wait_for(progress, 90, "training at world size 3 after the upgrade",
             until=lambda p: any(r["world_size"] == 3 for r in p.after(scaled_at)))
    assert jobs.status().get("restarts") == 0, jobs.status()

    # --- uninstall: what docs/operations.md says -------------------------------------------------------------
    operatorchart.uninstall(cluster.kubeconfig, installed.name, ns)
    wait_for(lambda: operatorchart.operator_pods(core, installed), 60, "the operator pod gone", until=lambda p: not p)
    uninstalled_at = time.time()
    for read, args in ((apps.read_namespaced_deployment, (full, ns)), (core.read_namespaced_service_account, (full, ns)),
                       (core.read_namespaced_service, (f"{full}-metrics", ns)),
                       (rbac.read_cluster_role, (f"{full}-framework",)), (rbac.read_cluster_role_binding,
                                                                           (f"{full}-framework",)),
                       (rbac.read_namespaced_role, (full, ns))):
        assert not exists(read, *args), f"{read.__name__}{args} left after helm uninstall"
    # The key stays (helm.sh/resource-policy: keep): a reinstall drives the stores of jobs still running.
    assert exists(core.read_namespaced_secret, f"{full}-rendezvous-key", ns)
    kept = {name for name in crd_names if exists(ext.read_custom_resource_definition, name)}
    assert kept == set(crd_names), f"Helm removed CRDs: {set(crd_names) - kept} (installed by it: " \
                                   f"{set(crd_names) - crds_before})"
    # Running jobs keep their pods, and torchrun goes on training ...
    steps_after(progress, uninstalled_at)
    status_before = jobs.status()
    # ... but nothing replaces a failed pod or updates the status any more.
    victim = sorted(workers)[0]
    assert faults.kill_pod(ns, victim, signal.SIGKILL, state_dir)
    wait_for(lambda: jobs.pod(victim), 30, f"{victim} Failed", until=lambda p: p.status.phase == "Failed")
    steps_after(progress, time.time())  # the survivors re-form without it: torchrun's own elasticity
    time.sleep(5)
    assert jobs.pod(victim).status.phase == "Failed", "the failed pod was replaced without an operator"
    assert jobs.status() == status_before, "the job's status changed without an operator"
    # No finalizers: deleting the job works without the operator, and the garbage collector removes its pods.
    assert not jobs.get().get("metadata", {}).get("finalizers")
    jobs.custom.delete_namespaced_custom_object("elasticjob.dev", "v1alpha1", ns, "elasticjobs", "train")
    wait_for(lambda: (jobs.worker_pods(), core.list_namespaced_service(ns).items), 90,
             "the job's pods and Services garbage-collected", until=lambda found: not found[0] and not found[1])
