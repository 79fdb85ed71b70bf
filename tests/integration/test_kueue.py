"""Jobs admitted by Kueue (the local cluster's add-on, v0.19.2), through the real API server: the Workload the
operator makes, waiting Queued, starting on admission with the flavor's node labels, preemption (pods stopped,
quota released as Kueue's own integrations do, nothing charged) and resumption, the Workload Finished at the end,
the chart's MutatingAdmissionPolicy, and the chart's RBAC for all of it.

Cheap workers (sleep); training through preemption is in tests/e2e/test_kueue_training.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from jobapi import GROUP, PLURAL, VERSION, create, job_manifest, pods, status_of, wait_phase
from kubernetes import client

from helpers import wait_for
from kueue_support import Queues, conditions, kueue, queued, queues  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
WORKER = {"requests": {"cpu": "400m", "memory": "64Mi"}}  # two of them and a store (100m) fit in 1 cpu
SHORT = ["python", "-c", "import time; time.sleep(6)"]


@pytest.fixture
def operator(operator_factory):
    return operator_factory(extra_args=["--kueue"])


def small(name: str, command=None, **spec) -> dict:
    extra = {"command": command} if command else {}
    return job_manifest(name, minReplicas=2, maxReplicas=2, replicas=2, resources=WORKER, **extra, **spec)


def admission(api, namespace, name, state, timeout=60) -> dict:
    return wait_for(lambda: status_of(api, namespace, name), timeout, f"{name} admission {state}",
                    until=lambda s: (s.get("admission") or {}).get("state") == state)


def events(api, namespace, name) -> list[str]:
    return [e.reason for e in api[1].list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items]


def test_a_queued_job_waits_then_runs_with_its_flavor_and_finishes_its_workload(api, namespace, operator,
                                                                                 queues: Queues):
    cq = queues.make(cpu="1", node_labels={"kubernetes.io/hostname": "local-node-1"})
    create(api, namespace, queued(small("first", SHORT)))
    status = admission(api, namespace, "first", "Admitted")
    assert status["admission"]["clusterQueue"] == cq and status["admission"]["workers"] == 2
    workload = queues.workload(status["admission"]["workload"])
    job = api[0].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "first")
    assert workload["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert workload["metadata"]["labels"]["elasticjob.dev/job-name"] == "first"
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("workers", 2), ("store", 1)]
    assert workload["spec"]["queueName"] == "lq"
    running = wait_for(lambda: pods(api, namespace) + pods(api, namespace, "rendezvous"), 60,
                       "the admitted pods on the flavor's node", until=lambda ps: len(ps) == 3 and all(
                           p.spec.node_name for p in ps))
    for pod in running:
        assert pod.spec.node_selector["kubernetes.io/hostname"] == "local-node-1" and pod.spec.node_name == "local-node-1"
        assert pod.metadata.labels["kueue.x-k8s.io/podset"] in ("workers", "store")

    # No room for a second one: it waits, suspended, in phase Queued with Kueue's words.
    create(api, namespace, queued(small("second", SHORT)))
    wait_phase(api, namespace, "second", "Queued", reason="Queued")
    # Queued before Kueue has looked at the Workload ("waiting for Kueue to admit ..."), then in Kueue's words.
    wait_for(lambda: status_of(api, namespace, "second"), 30, "Kueue's reason on the queued job",
             until=lambda s: s.get("phase") == "Queued" and "insufficient unused quota" in (s.get("message") or ""))
    assert api[0].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "second")["spec"]["runPolicy"]["suspend"]
    assert not [p for p in pods(api, namespace) if p.metadata.name.startswith("second")]
    table = subprocess.run(["kubectl", "get", "ej", "-n", namespace, "--kubeconfig",
                            str(ROOT / ".localcluster" / "kubeconfig")], capture_output=True, text=True, check=True)
    rows = {row["NAME"]: row for row in kubectl_table(table.stdout)}
    assert list(rows["second"])[:10] == ["NAME", "PHASE", "READY", "DESIRED", "SPARES", "MIN", "MAX", "RESTARTS",
                                         "GOODPUT", "ADMISSION"], table.stdout
    assert rows["second"]["PHASE"] == "Queued" and rows["second"]["ADMISSION"] == "Queued", table.stdout

    # The first one ends: its Workload is Finished, which frees the quota; the second one runs.
    wait_phase(api, namespace, "first", "Succeeded", timeout=60)
    finished = wait_for(lambda: queues.workload(workload["metadata"]["name"]), 30, "the Workload Finished",
                        until=lambda w: conditions(w).get("Finished", {}).get("status") == "True")
    assert conditions(finished)["Finished"]["reason"] == "Succeeded"
    assert admission(api, namespace, "first", "Finished")["admission"]["workload"] == workload["metadata"]["name"]
    admission(api, namespace, "second", "Admitted", timeout=60)
    wait_phase(api, namespace, "second", "Running", timeout=60)
    assert events(api, namespace, "second").count("Admitted") == 1
    assert "Queued" in events(api, namespace, "second") and "CreatedWorkload" in events(api, namespace, "second")


def test_preemption_stops_the_pods_releases_the_quota_and_charges_nothing(api, namespace, operator,
                                                                           queues: Queues):
    queues.make(cpu="1")
    low, high = queues.priority("low", 10), queues.priority("high", 1000)
    create(api, namespace, queued(small("low"), priority=low))
    wait_phase(api, namespace, "low", "Running", timeout=60)
    before = {p.metadata.uid for p in pods(api, namespace)}
    name = status_of(api, namespace, "low")["admission"]["workload"]
    assert queues.workload(name)["spec"]["priority"] == 10

    create(api, namespace, queued(small("high"), priority=high))
    preempted = wait_phase(api, namespace, "low", "Queued", reason="Preempted", timeout=60)
    assert preempted["admission"]["state"] == "Preempted"
    # Kueue admits the preemptor only once the quota is released, which the operator does once the pods are gone.
    wait_phase(api, namespace, "high", "Running", timeout=90)
    released = queues.workload(name)
    assert "admission" not in released["status"]
    conds = conditions(released)
    assert (conds["QuotaReserved"]["status"], conds["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")
    assert conds["Admitted"]["status"] == "False"
    assert not [p for p in pods(api, namespace) if p.metadata.uid in before]
    status = status_of(api, namespace, "low")
    assert status["restarts"] == 0 and not status.get("lastFailures") and status.get("infrastructureFailures", 0) == 0

    # The preemptor goes: the preempted job is admitted again and resumes with new pods, still uncharged.
    api[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "high")
    wait_phase(api, namespace, "low", "Running", timeout=90)
    resumed = status_of(api, namespace, "low")
    assert resumed["restarts"] == 0 and not resumed.get("lastFailures")
    reasons = events(api, namespace, "low")
    assert reasons.count("Preempted") == 1 and reasons.count("Admitted") == 2 and "QuotaReleased" in reasons


# Never beside other tests: the chart's default values bind the policy in every namespace (make test runs it after
# the parallel part).
@pytest.mark.alone
def test_the_charts_policy_creates_queued_jobs_suspended(kube, api, namespace, crds_installed):
    import chart_rbac

    policies = [d for d in chart_rbac.render({"kueue": {"mode": "on"}}, f"p{namespace[-6:]}", namespace)
                if d["kind"].startswith("MutatingAdmissionPolicy")]
    admissions = client.AdmissionregistrationV1Api(kube)
    policy, binding = policies
    admissions.create_mutating_admission_policy(policy)
    try:
        admissions.create_mutating_admission_policy_binding(binding)
        try:
            # Policies take effect once the API server has loaded them: retry a throwaway job until one is.
            def created_suspended():
                name = f"probe-{len(api[0].list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)['items'])}"
                return create(api, namespace, queued(small(name)))["spec"]["runPolicy"]["suspend"]
            wait_for(created_suspended, 30, "a queued job created suspended")
            plain = create(api, namespace, small("plain"))
            assert plain["spec"]["runPolicy"]["suspend"] is False
        finally:
            admissions.delete_mutating_admission_policy_binding(binding["metadata"]["name"])
    finally:
        admissions.delete_mutating_admission_policy(policy["metadata"]["name"])


def test_the_operator_runs_a_queued_gang_job_as_its_service_account(api, kube, cluster, namespace, queues,
                                                                      install_rbac, operator_factory, tmp_path):
    from test_rbac import PERMISSION_ERRORS

    from chart_rbac import allowed, service_account_kubeconfig

    user = install_rbac({"watch": {"allNamespaces": False, "namespaces": [namespace]}, "kueue": {"mode": "on"},
                         "gangScheduling": {"workloadAPI": True, "coscheduling": False}}, namespace)
    wait_for(lambda: allowed(kube, user, "create", "kueue.x-k8s.io", "workloads", "", namespace), 30, "the grants")
    kubeconfig = service_account_kubeconfig(kube, Path(cluster.kubeconfig), namespace, user.rsplit(":", 1)[1],
                                            tmp_path / "operator.kubeconfig")
    operator = operator_factory(extra_args=["--kueue"], env={"KUBECONFIG": str(kubeconfig)})
    queues.make(cpu="2")
    create(api, namespace, queued(small("gang", SHORT, scheduling={"gang": "Workload"}), priority=None))
    wait_phase(api, namespace, "gang", "Succeeded", timeout=90)
    admission(api, namespace, "gang", "Finished")
    denied = [line for line in operator.log_text().splitlines() if any(m in line for m in PERMISSION_ERRORS)]
    assert not denied, "\n".join(denied[:10])


def test_with_its_defaults_the_operator_finds_kueue_and_a_labelled_job_waits_for_admission(
        api, namespace, operator_factory, queues: Queues):
    operator_factory()  # no --kueue: auto, and the local cluster serves Kueue's API
    queues.make(cpu="1")
    create(api, namespace, queued(small("found", SHORT)))
    status = admission(api, namespace, "found", "Admitted")
    assert queues.workload(status["admission"]["workload"])["spec"]["queueName"] == "lq"


def test_with_kueue_off_a_labelled_job_does_not_start_and_says_why(api, namespace, operator_factory,
                                                                    queues: Queues):
    operator_factory(extra_args=["--kueue", "off"])
    queues.make(cpu="1")
    create(api, namespace, queued(small("held", SHORT)))
    status = wait_phase(api, namespace, "held", "Queued", reason="KueueOff")
    assert "Kueue" in status["message"] and "remove the label" in status["message"]
    wait_for(lambda: events(api, namespace, "held"), 30, "the Warning Event", until=lambda rs: "KueueOff" in rs)
    assert not [p for p in pods(api, namespace) if p.metadata.name.startswith("held")]


def test_the_charts_policy_keeps_the_queue_label_of_a_running_job(kube, api, namespace, crds_installed):
    import chart_rbac

    values = {"watch": {"allNamespaces": False, "namespaces": [namespace]}}  # no other test's namespace
    policy, binding = [d for d in chart_rbac.render(values, f"v{namespace[-6:]}", namespace)
                       if d["kind"].startswith("ValidatingAdmissionPolicy")
                       and d["metadata"]["name"].endswith("-queue-label-immutable")]
    admissions = client.AdmissionregistrationV1Api(kube)
    admissions.create_validating_admission_policy(policy)
    try:
        admissions.create_validating_admission_policy_binding(binding)
        try:
            create(api, namespace, queued(small("running")))  # no operator here: it stays as created
            create(api, namespace, queued(small("paused", runPolicy={"suspend": True})))

            def relabel(name, value):
                patch = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": value}}}
                try:
                    api[0].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
                    return None
                except client.ApiException as exc:
                    return exc

            # Policies take effect once the API server has loaded them: retry a refused change until one is.
            # (a new value each time: a change let through before that is the label now).
            tries = iter(range(10_000))
            refused = wait_for(lambda: relabel("running", f"other-{next(tries)}"), 30, "the label change refused",
                               until=lambda exc: exc is not None)
            assert refused.status == 403 and "suspend the job first" in refused.body
            assert relabel("running", None).status == 403  # removed
            assert relabel("paused", None) is None  # a suspended job may leave its queue
        finally:
            admissions.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    finally:
        admissions.delete_validating_admission_policy(policy["metadata"]["name"])


def kubectl_table(text: str) -> list[dict[str, str]]:
    """kubectl's table by its header's columns: an empty cell (no goodput yet) is blank, not a missing word."""
    header, *lines = text.splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [{header[a:b].strip(): line[a:b].strip() for a, b in bounds} for line in lines]
