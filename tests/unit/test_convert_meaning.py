"""`elasticjob convert` changes no job in silence (the user review's findings): a default that differs is written
out, a value with another meaning is dropped with a warning, what `kubectl get -o yaml` prints for many jobs (a
List) and what Kubeflow accepts (replica types in any case) convert, and the HorizontalPodAutoscaler cannot take
the training operator's own.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from test_convert import PYTHON_DDP, TORCHRUN, check_runs, converted_job, pod, pytorchjob

from elasticjob.cli import main
from elasticjob.convert import ConversionError, InputError, convert_documents, convert_text

ROOT = Path(__file__).resolve().parents[2]
METRICS = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                       "averageUtilization": 80}}}]


def never(job, backoff=None):
    """The job with restartPolicy Never on every replica (and a backoffLimit)."""
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["restartPolicy"] = "Never"
    if backoff is not None:
        job["spec"].setdefault("runPolicy", {})["backoffLimit"] = backoff
    return job


# --- runPolicy -------------------------------------------------------------------------------------------------


def test_an_unset_clean_pod_policy_is_kubeflows_none_written_out():
    document, warnings = converted_job(pytorchjob(workers=(2, TORCHRUN)))
    assert document["spec"]["runPolicy"] == {"cleanPodPolicy": "None"}
    (said,) = [w for w in warnings if "cleanPodPolicy" in w]
    assert "Kubeflow's default" in said and "Running" in said


@pytest.mark.parametrize("policy", ["All", "Running", "None"])
def test_a_clean_pod_policy_that_is_set_carries_over_without_a_word(policy):
    document, warnings = converted_job(pytorchjob(workers=(2, TORCHRUN), run_policy={"cleanPodPolicy": policy}))
    assert document["spec"]["runPolicy"] == {"cleanPodPolicy": policy}
    assert not any("cleanPodPolicy" in w for w in warnings)


def test_backoff_limit_under_restart_policy_never_is_said_to_be_dropped():
    document, warnings = converted_job(never(pytorchjob(workers=(2, TORCHRUN)), backoff=4))
    assert document["spec"]["maxRestarts"] == 0
    (said,) = [w for w in warnings if "backoffLimit" in w]
    assert "backoffLimit 4 dropped" in said and "Never" in said


def test_restart_policy_never_without_a_backoff_limit_names_none():
    _, warnings = converted_job(never(pytorchjob(workers=(2, TORCHRUN))))
    assert not any("backoffLimit" in w for w in warnings)
    assert any("restartPolicy Never" in w for w in warnings)


def test_the_pytorch_operators_run_policy_fields_at_spec_level_are_read():
    """kubeflow.org/v1 as the pytorch-operator served it had them in spec, as the Kubeflow docs still show."""
    job = pytorchjob(workers=(2, TORCHRUN))
    job["spec"].update({"cleanPodPolicy": "All", "backoffLimit": 2, "activeDeadlineSeconds": 600,
                        "ttlSecondsAfterFinished": 60})
    document, warnings = converted_job(job)
    assert document["spec"]["runPolicy"] == {"activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60,
                                             "cleanPodPolicy": "All"}
    assert document["spec"]["maxRestarts"] == 2
    assert any("spec.cleanPodPolicy" in w and "runPolicy" in w for w in warnings), warnings


def test_run_policy_wins_over_the_same_field_at_spec_level_and_says_so():
    job = pytorchjob(workers=(2, TORCHRUN), run_policy={"cleanPodPolicy": "Running"})
    job["spec"]["cleanPodPolicy"] = "All"
    document, warnings = converted_job(job)
    assert document["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    assert any("spec.cleanPodPolicy All dropped" in w for w in warnings), warnings


def test_a_spec_field_the_converter_does_not_know_is_named():
    job = pytorchjob(workers=(2, TORCHRUN))
    job["spec"]["successPolicy"] = "AllWorkers"
    _, warnings = converted_job(job)
    assert any("spec.successPolicy" in w and "ignored" in w for w in warnings), warnings


# --- rendezvous ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("elastic", [
    {"rdzvBackend": "etcd", "rdzvHost": "etcd-service", "rdzvPort": 2379},
    {"rdzvBackend": "etcd-v2", "rdzvPort": 2379},
    {"rdzvBackend": "c10d", "rdzvHost": "store.infra", "rdzvPort": 29500},
], ids=["etcd host", "etcd without host", "a c10d host of ones own"])
def test_the_port_of_an_external_rendezvous_is_not_the_stores(elastic):
    document, warnings = converted_job(pytorchjob(workers=(2, TORCHRUN), elastic=elastic))
    assert "port" not in document["spec"].get("rendezvous", {})
    (said,) = [w for w in warnings if "rdzvPort" in w]
    assert f"rdzvPort {elastic['rdzvPort']} dropped" in said and "29400" in said


def test_the_port_of_the_jobs_own_c10d_rendezvous_is_the_stores():
    document, warnings = converted_job(pytorchjob(workers=(2, TORCHRUN), elastic={"rdzvBackend": "c10d",
                                                                                  "rdzvPort": 29500}))
    assert document["spec"]["rendezvous"] == {"port": 29500}
    assert not any("rdzvPort" in w for w in warnings)


# --- replica types ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("master, worker", [("master", "worker"), ("MASTER", "Worker"), ("Master", "wOrKeR")])
def test_replica_types_in_any_case_are_kubeflows_master_and_worker(master, worker):
    job = pytorchjob(workers=(2, PYTHON_DDP), master=copy.deepcopy(PYTHON_DDP))
    specs = job["spec"]["pytorchReplicaSpecs"]
    job["spec"]["pytorchReplicaSpecs"] = {master: specs["Master"], worker: specs["Worker"]}
    document, _ = converted_job(job)
    check_runs(document)
    assert document["spec"]["minReplicas"] == document["spec"]["maxReplicas"] == 3


def test_the_same_replica_type_twice_in_two_cases_is_refused_naming_both():
    job = pytorchjob(workers=(2, TORCHRUN))
    job["spec"]["pytorchReplicaSpecs"]["worker"] = copy.deepcopy(job["spec"]["pytorchReplicaSpecs"]["Worker"])
    with pytest.raises(ConversionError, match="Worker and worker"):
        convert_documents([job])


def test_a_lowercase_master_that_differs_is_named_as_kubeflow_names_it():
    job = pytorchjob(workers=(2, pod(["torchrun", "t.py"], gpus=2)), master=pod(["torchrun", "t.py"], gpus=1))
    specs = job["spec"]["pytorchReplicaSpecs"]
    job["spec"]["pytorchReplicaSpecs"] = {"master": specs["Master"], "worker": specs["Worker"]}
    with pytest.raises(ConversionError, match="Master 1, Worker 2"):
        convert_documents([job])


# --- a List ----------------------------------------------------------------------------------------------------


def kubectl_list(*items):
    """What `kubectl get pytorchjobs -o yaml` prints."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": list(items)}


def named(job, name):
    job["metadata"]["name"] = name
    return job


def test_a_list_of_pytorchjobs_converts_each_as_a_document_of_its_own():
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "script"}}
    # Copies: safe_dump writes one object used twice as an anchor and an alias, which convert refuses.
    text = yaml.safe_dump(kubectl_list(named(pytorchjob(workers=(2, copy.deepcopy(TORCHRUN))), "a"), config,
                                       named(pytorchjob(workers=(1, copy.deepcopy(TORCHRUN))), "b")))
    result = convert_text(text)
    assert [(d["kind"], d["metadata"]["name"]) for d in result.documents] == [
        ("ElasticJob", "a"), ("ConfigMap", "script"), ("ElasticJob", "b")]
    for document in result.documents[::2]:
        check_runs(document)
    assert any(w.startswith("PyTorchJob a: ") for w in result.warnings)
    assert not any(w.startswith("List") for w in result.warnings), result.warnings
    assert list(yaml.safe_load_all(result.yaml())) == result.documents


def test_a_typed_list_gives_its_items_their_kind():
    """The API's own PyTorchJobList (`kubectl get --raw`) leaves kind and apiVersion out of its items."""
    item = named(pytorchjob(workers=(2, TORCHRUN)), "a")
    del item["kind"], item["apiVersion"]
    result = convert_documents([{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList", "items": [item]}])
    assert [d["kind"] for d in result.documents] == ["ElasticJob"]


def test_an_empty_list_says_it_is_empty():
    with pytest.raises(ConversionError, match="no PyTorchJob found.*empty List"):
        convert_documents([kubectl_list()])


@pytest.mark.parametrize("document, words", [
    ({"apiVersion": "v1", "kind": "List", "items": {"a": 1}}, "document 1: items: expected a list, found a mapping"),
    ({"apiVersion": "v1", "kind": "List", "items": ["x"]}, "document 1: items[0]: expected a mapping"),
    (kubectl_list({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "a"},
                   "spec": {"pytorchReplicaSpecs": []}}),
     "PyTorchJob a: spec.pytorchReplicaSpecs: expected a mapping"),
])
def test_a_list_of_the_wrong_shape_is_refused_by_its_path(document, words):
    with pytest.raises(InputError, match=re.escape(words)):
        convert_documents([document])


def test_a_refused_item_of_a_list_is_named(tmp_path, capsys):
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(kubectl_list(named(pytorchjob(workers=(1, pod(["torchrun", "t.py"],
                                                                                  name="trainer"))), "b"))))
    assert main(["convert", str(path)]) == 1
    assert "PyTorchJob b: no container named 'pytorch'" in capsys.readouterr().err


# --- the HorizontalPodAutoscaler -------------------------------------------------------------------------------


def test_the_autoscaler_is_not_named_as_the_training_operators_own():
    """The training operator names its HPA as the PyTorchJob (pytorch/hpa.go); the ElasticJob keeps that name."""
    result = convert_documents([pytorchjob(workers=(2, TORCHRUN), elastic={"minReplicas": 1, "maxReplicas": 4,
                                                                           "metrics": METRICS})])
    job, hpa = result.documents
    assert hpa["metadata"] == {"name": "train-elasticjob", "namespace": "ml"}
    assert hpa["spec"]["scaleTargetRef"]["name"] == job["metadata"]["name"] == "train"
    assert any("train-elasticjob" in w and "HorizontalPodAutoscaler" in w for w in result.warnings)


def test_a_long_name_still_makes_a_valid_autoscaler_name():
    job = named(pytorchjob(workers=(2, TORCHRUN), elastic={"minReplicas": 1, "maxReplicas": 4, "metrics": METRICS}),
                "a" * 240 + ".b-c")
    _, hpa = convert_documents([job]).documents
    name = hpa["metadata"]["name"]
    assert len(name) <= 253 and name.endswith("-elasticjob")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)


# --- the docs ---------------------------------------------------------------------------------------------------


def test_the_migration_guide_stops_the_pytorchjob_before_applying_the_elasticjob():
    text = (ROOT / "docs" / "migrating.md").read_text()
    section = text.split("## From Kubeflow's PyTorchJob")[1].split("### Field by field")[0]
    commands = [line.strip() for line in section.splitlines() if line.startswith("$ ")]
    applies = [i for i, line in enumerate(commands) if "kubectl apply" in line]
    stops = [i for i, line in enumerate(commands) if re.search(r"kubectl (delete|patch) pytorchjob", line)]
    assert applies and stops and max(stops) < min(applies), commands
    assert not any("convert -" in line and "kubectl apply" in line for line in commands), commands
