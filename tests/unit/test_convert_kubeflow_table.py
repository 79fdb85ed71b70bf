"""`elasticjob convert` on PyTorchJobs as Kubeflow's examples, docs and users write them (tests/unit/convert_cases/,
each file naming its source): every one converts to ElasticJobs that the CRD's schema (the API server's check,
strict about unknown fields) and the operator accept, and every change of meaning is either rewritten or said.

"Said" is checked twice: the words each case must warn of, and, for every case alike, each thing the review found
changed in silence (a selector on Kubeflow's pod labels, cleanPodPolicy's default, backoffLimit, rdzvPort, the
HorizontalPodAutoscaler's name) left either rewritten or named in a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_convert import check_runs
from test_pod_template_schema import crd_schema, errors

from elasticjob import naming
from elasticjob.convert import convert_text

CASES_DIR = Path(__file__).parent / "convert_cases"
KUBEFLOW_KEYS = ("training.kubeflow.org/", "job-name", "replica-type", "replica-index", "job-role", "group-name",
                 "pytorch-job-name", "pytorch-replica-", "controller-name")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"

# file: (each ElasticJob's spec fields expected, besides the template and what is checked for all; words the
# warnings must say)
CASES: dict[str, tuple[list[dict[str, Any]], list[str]]] = {
    "01-simple-mnist.yaml": (
        [{"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 1, "runPolicy": {"cleanPodPolicy": "None"}}],
        ["now runs under torchrun", "cleanPodPolicy unset", "without limit"]),
    "02-mnist-nccl-args-only.yaml": (
        [{"minReplicas": 2, "maxReplicas": 2}], ["only args", "cleanPodPolicy unset"]),
    "03-torchrun-cpu.yaml": ([{"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 2}], ["cleanPodPolicy unset"]),
    "04-deepspeed-gpu.yaml": ([{"minReplicas": 2, "maxReplicas": 2}], ["without limit"]),
    "05-elastic-echo.yaml": (
        [{"minReplicas": 1, "maxReplicas": 2, "maxRestarts": 100}], ["torchrun flags --rdzv-backend taken off"]),
    "06-elastic-imagenet-hpa.yaml": (
        [{"minReplicas": 1, "maxReplicas": 3, "replicas": 2, "maxRestarts": 100}],
        ["HorizontalPodAutoscaler elastic-example-imagenet-elasticjob"]),
    "07-kueue-queue-label.yaml": ([{"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 1}], []),
    "08-elastic-etcd.yaml": (
        [{"minReplicas": 2, "maxReplicas": 8, "replicas": 4}],
        ["rdzvBackend etcd", "rdzvPort 2379 dropped", "elasticPolicy.rdzvHost dropped"]),
    "09-kubectl-get-list.yaml": (
        [{"minReplicas": 4, "maxReplicas": 4, "nprocPerNode": 1}, {"minReplicas": 1, "maxReplicas": 2}],
        ["PyTorchJob pytorch-tcp-dist-mnist: spec.cleanPodPolicy", "PyTorchJob elastic-example-echo: "]),
    "10-lowercase-replica-keys.yaml": ([{"minReplicas": 3, "maxReplicas": 3, "maxRestarts": 5}], []),
    "11-pod-affinity-same-host.yaml": (
        [{"minReplicas": 4, "maxReplicas": 4}],
        [f"podAffinity.{REQUIRED}[0]: Kubeflow's pod labels rewritten", "runs as written"]),
    "12-anti-affinity-one-per-node.yaml": (
        [{"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 8}],
        [f"podAntiAffinity.{REQUIRED}[0]: Kubeflow's pod labels rewritten"]),
    "13-role-affinity-and-spread.yaml": (
        [{"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 64}],
        [f"podAntiAffinity.{REQUIRED}[0]: kept as written", f"podAffinity.{REQUIRED}[0]: kept as written",
         "Pending", "topologySpreadConstraints[0]: Kubeflow's pod labels rewritten"]),
    "14-never-with-backoff.yaml": (
        [{"minReplicas": 3, "maxReplicas": 3, "nprocPerNode": 1, "maxRestarts": 0}],
        ["backoffLimit 3 dropped", "restartPolicy Never"]),
    "15-gang-scheduling.yaml": (
        [{"minReplicas": 3, "maxReplicas": 3, "scheduling": {"scheduleTimeoutSeconds": 300}}],
        ["no gang is set", "kueue.x-k8s.io/queue-name"]),
}


def test_the_table_holds_every_case_file_and_each_names_its_source():
    files = sorted(p.name for p in CASES_DIR.glob("*.yaml"))
    assert files == sorted(CASES) and len(files) >= 10
    for name in files:
        assert (CASES_DIR / name).read_text().startswith("# Source: "), name


def pytorchjobs(text: str) -> list[dict[str, Any]]:
    found = []
    for document in yaml.safe_load_all(text):
        found += document.get("items", []) if document.get("kind") == "List" else [document]
    return [d for d in found if d.get("kind") == "PyTorchJob"]


def selectors(pod_spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each pod affinity term and topology spread constraint, by the path the warnings name it with."""
    found = []
    for kind in ("podAffinity", "podAntiAffinity"):
        section = (pod_spec.get("affinity") or {}).get(kind) or {}
        found += [(f"{kind}.{REQUIRED}[{i}]", t) for i, t in enumerate(section.get(REQUIRED) or [])]
        found += [(f"{kind}.{PREFERRED}[{i}]", t["podAffinityTerm"])
                  for i, t in enumerate(section.get(PREFERRED) or [])]
    found += [(f"topologySpreadConstraints[{i}]", c) for i, c in enumerate(pod_spec.get("topologySpreadConstraints")
                                                                          or [])]
    return found


def kubeflow_keys(selector_term: dict[str, Any]) -> list[str]:
    selector = selector_term.get("labelSelector") or {}
    keys = [*(selector.get("matchLabels") or {}), *(e["key"] for e in selector.get("matchExpressions") or []),
            *selector_term.get("matchLabelKeys", []), *selector_term.get("mismatchLabelKeys", [])]
    return [k for k in keys if k.startswith(KUBEFLOW_KEYS)]


def said_of(job: dict[str, Any], warnings: list[str]) -> list[str]:
    prefix = f"PyTorchJob {job['metadata']['name']}: "
    return [w.removeprefix(prefix) for w in warnings if w.startswith(prefix)]


def check_nothing_changed_in_silence(job: dict[str, Any], out: dict[str, Any], hpa: dict[str, Any] | None,
                                     said: list[str]) -> None:
    spec, run_policy = job["spec"], job["spec"].get("runPolicy") or {}
    for where, selector_term in selectors(out["spec"]["template"]["spec"]):
        if kubeflow_keys(selector_term):
            assert any(w.startswith("template.spec.") and where in w and "kept as written" in w for w in said), \
                (where, said)
    if "cleanPodPolicy" not in run_policy and "cleanPodPolicy" not in spec:
        assert out["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    backoff = run_policy.get("backoffLimit", spec.get("backoffLimit"))
    if backoff is not None and out["spec"].get("maxRestarts") != backoff:
        assert any(f"backoffLimit {backoff} dropped" in w for w in said), said
    port = (spec.get("elasticPolicy") or {}).get("rdzvPort")
    if port is not None and out["spec"].get("rendezvous", {}).get("port") != port:
        assert any(f"rdzvPort {port} dropped" in w for w in said), said
    if hpa is not None:
        assert hpa["metadata"]["name"] != job["metadata"]["name"]
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob",
                                                 "name": out["metadata"]["name"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_kubeflow_pytorchjob_converts_and_says_every_change_of_meaning(name):
    text = (CASES_DIR / name).read_text()
    expected, words = CASES[name]
    result = convert_text(text)
    jobs = [d for d in result.documents if d["kind"] == "ElasticJob"]
    hpas = {d["spec"]["scaleTargetRef"]["name"]: d for d in result.documents if d["kind"] == "HorizontalPodAutoscaler"}
    inputs = pytorchjobs(text)
    assert len(jobs) == len(inputs) == len(expected)
    for job, out, fields in zip(inputs, jobs, expected, strict=True):
        assert errors(crd_schema(), out) == []
        check_runs(out)
        assert out["metadata"]["name"] == job["metadata"]["name"]
        assert {k: v for k, v in out["spec"].items() if k in fields} == fields
        check_nothing_changed_in_silence(job, out, hpas.get(out["metadata"]["name"]),
                                         said_of(job, result.warnings))
    for word in words:
        assert any(word in w for w in result.warnings), (word, result.warnings)


def test_the_job_pods_selectors_in_the_table_select_the_operators_labels():
    """The rewritten terms name the labels the operator puts on worker pods (builders: naming.worker_labels)."""
    document = convert_text((CASES_DIR / "11-pod-affinity-same-host.yaml").read_text()).documents[0]
    (the_term,) = document["spec"]["template"]["spec"]["affinity"]["podAffinity"][REQUIRED]
    labels = naming.worker_labels("pytorch-dist-job", 0)
    assert the_term["labelSelector"] == {"matchLabels": {naming.ROLE_LABEL: "worker"}, "matchExpressions": [
        {"key": naming.JOB_LABEL, "operator": "In", "values": ["pytorch-dist-job"]}]}
    assert labels[naming.JOB_LABEL] == "pytorch-dist-job" and labels[naming.ROLE_LABEL] == "worker"
