"""`elasticjob convert`: Kubeflow PyTorchJobs (kubeflow.org/v1) as ElasticJobs.

The inputs are written here from the field tables of Kubeflow's PyTorchJob API (PyTorchJobSpec, ElasticPolicy,
RunPolicy, SchedulingPolicy, ReplicaSpec): a plain DDP job with a Master, an elastic job, one with every run
policy. Each output must parse as the real ElasticJobSpec, keep the size rules the API server's CEL rules check,
and pass the operator's own checks (lifecycle.validate) with the worker command routed through the kit.
"""

from __future__ import annotations

import copy
import io

import pytest
import yaml

from elasticjob import builders, kit, naming
from elasticjob.cli import main
from elasticjob.convert import ConversionError, convert_documents, convert_text
from elasticjob.domain import JobRef
from elasticjob.models import API_VERSION, KIND, ElasticJobSpec
from elasticjob.planner import lifecycle

IMAGE = "registry.example/train:2.13"


def pod(command=None, args=None, gpus=0, env=None, name="pytorch"):
    container = {"name": name, "image": IMAGE}
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if env:
        container["env"] = env
    return {"spec": {"containers": [container]}}


def pytorchjob(workers=None, master=None, elastic=None, run_policy=None, nproc=None, **meta):
    specs = {}
    if master is not None:
        specs["Master"] = {"replicas": 1, "restartPolicy": "OnFailure", "template": master}
    if workers is not None:
        count, template = workers
        specs["Worker"] = {"replicas": count, "restartPolicy": "OnFailure", "template": template}
    spec = {"pytorchReplicaSpecs": specs}
    if elastic is not None:
        spec["elasticPolicy"] = elastic
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    if nproc is not None:
        spec["nprocPerNode"] = nproc
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ml", **meta}, "spec": spec}


PYTHON_DDP = pod(["python3", "/workspace/mnist.py", "--epochs=1"])
TORCHRUN = pod(["torchrun", "/workspace/train.py"], args=["--steps", "60"])


def converted_job(job):
    result = convert_documents([job])
    return result.documents[0], result.warnings


def check_runs(document):
    """What the API server and the operator would check of the converted job."""
    assert document["apiVersion"] == API_VERSION and document["kind"] == KIND
    spec = ElasticJobSpec.model_validate(document["spec"])
    assert 1 <= spec.min_replicas <= spec.max_replicas
    assert spec.replicas is None or spec.min_replicas <= spec.replicas <= spec.max_replicas
    ref = JobRef(namespace="ml", name=document["metadata"]["name"], uid="u1", spec=spec)
    assert lifecycle.validate(ref) == []
    container = builders.worker_container(spec.template)
    assert container["name"] == naming.WORKER_CONTAINER
    return spec, container


NONE = {"runPolicy": {"cleanPodPolicy": "None"}}  # Kubeflow's default, written out where a job sets none

# (case, input, the spec's fields expected besides the template, the worker's command, args)
CASES = [
    ("plain DDP: Master and one Worker, python -> torchrun, fixed size",
     pytorchjob(workers=(1, PYTHON_DDP), master=PYTHON_DDP),
     {"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 1, **NONE},
     ["torchrun", "/workspace/mnist.py", "--epochs=1"], None),
    ("Workers only, python -u with the script in args",
     pytorchjob(workers=(3, pod(["python", "-u"], args=["train.py", "--lr", "0.1"])),
                run_policy={"backoffLimit": 5}),
     {"minReplicas": 3, "maxReplicas": 3, "nprocPerNode": 1, "maxRestarts": 5, **NONE},
     ["torchrun"], ["train.py", "--lr", "0.1"]),
    ("python -m a module",
     pytorchjob(workers=(2, pod(["python", "-m", "trainer.main"]))),
     {"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 1, **NONE},
     ["torchrun", "-m", "trainer.main"], None),
    ("elastic: min/max from elasticPolicy, replicas from the Workers, maxRestarts over backoffLimit",
     pytorchjob(workers=(2, pod(["python", "-m", "torch.distributed.run", "/workspace/imagenet.py"])),
                elastic={"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 3, "maxRestarts": 100},
                run_policy={"backoffLimit": 7}),
     {"minReplicas": 1, "maxReplicas": 3, "replicas": 2, "maxRestarts": 100, **NONE},
     ["python", "-m", "torch.distributed.run", "/workspace/imagenet.py"], None),
    ("elastic at its maximum: replicas left to default",
     pytorchjob(workers=(4, TORCHRUN), elastic={"minReplicas": 2, "maxReplicas": 4}, nproc="2"),
     {"minReplicas": 2, "maxReplicas": 4, "nprocPerNode": 2, **NONE},
     ["torchrun", "/workspace/train.py"], ["--steps", "60"]),
    ("torchrun flags the operator sets are taken off command and args; nproc and restarts kept from them",
     pytorchjob(workers=(2, pod(["torchrun", "--nnodes=1:2", "--rdzv_backend", "c10d"],
                                args=["--nproc_per_node=2", "--max-restarts", "4", "--standalone",
                                      "--log-dir", "/logs", "train.py", "--nnodes", "9"], gpus=2))),
     {"minReplicas": 2, "maxReplicas": 2, "nprocPerNode": 2, "maxRestarts": 4, **NONE},
     ["torchrun"], ["--log-dir", "/logs", "train.py", "--nnodes", "9"]),
    ("rendezvous: the c10d store's port and timeouts carry over",
     pytorchjob(workers=(2, TORCHRUN), elastic={
         "minReplicas": 1, "maxReplicas": 2, "rdzvBackend": "c10d", "rdzvPort": 29500,
         "rdzvConf": [{"key": "join_timeout", "value": "900"}, {"key": "last_call_timeout", "value": "5"},
                      {"key": "keep_alive_interval", "value": "3"}, {"key": "is_host", "value": "true"}]}),
     {"minReplicas": 1, "maxReplicas": 2, "rendezvous": {"port": 29500, "joinTimeoutSeconds": 900,
                                                         "lastCallTimeoutSeconds": 5, "keepAliveIntervalSeconds": 3},
      **NONE},
     ["torchrun", "/workspace/train.py"], ["--steps", "60"]),
    ("run policy: suspend, deadlines, TTL, clean-up; queue and priority",
     pytorchjob(workers=(2, TORCHRUN), run_policy={
         "suspend": True, "activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 600, "cleanPodPolicy": "All",
         "backoffLimit": 2, "schedulingPolicy": {"queue": "team-a", "minAvailable": 2, "priorityClass": "high",
                                                 "scheduleTimeoutSeconds": 120}}),
     {"minReplicas": 2, "maxReplicas": 2, "maxRestarts": 2,
      "runPolicy": {"suspend": True, "activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 600,
                    "cleanPodPolicy": "All"}, "scheduling": {"scheduleTimeoutSeconds": 120}},
     ["torchrun", "/workspace/train.py"], ["--steps", "60"]),
    ("restartPolicy Never: no restart",
     {**pytorchjob(workers=(2, TORCHRUN), run_policy={"backoffLimit": 3}),
      "spec": {"runPolicy": {"backoffLimit": 3}, "pytorchReplicaSpecs": {
          "Worker": {"replicas": 2, "restartPolicy": "Never", "template": TORCHRUN}}}},
     {"minReplicas": 2, "maxReplicas": 2, "maxRestarts": 0, **NONE},
     ["torchrun", "/workspace/train.py"], ["--steps", "60"]),
    ("a Master alone", pytorchjob(master=PYTHON_DDP), {"minReplicas": 1, "maxReplicas": 1, "nprocPerNode": 1, **NONE},
     ["torchrun", "/workspace/mnist.py", "--epochs=1"], None),
]


@pytest.mark.parametrize("case, job, fields, command, args", CASES, ids=[c[0] for c in CASES])
def test_a_pytorchjob_converts_to_an_elasticjob_that_runs(case, job, fields, command, args):
    before = copy.deepcopy(job)
    document, _ = converted_job(job)
    spec, container = check_runs(document)
    assert {k: v for k, v in document["spec"].items() if k != "template"} == fields
    assert container["command"] == command
    assert container.get("args") == args
    # Every command converted here runs warm through the kit's launcher.
    assert kit.warm_starts(spec, container, "kit:1").on
    assert job == before, "the input is left as it was"


def test_metadata_carries_over_without_what_the_cluster_added():
    job = pytorchjob(workers=(1, TORCHRUN), labels={"team": "a", "kueue.x-k8s.io/queue-name": "q"},
                     annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}", "owner": "me"},
                     uid="123", resourceVersion="9")
    job["status"] = {"conditions": []}
    document, _ = converted_job(job)
    assert document["metadata"] == {"name": "train", "namespace": "ml", "annotations": {"owner": "me"},
                                    "labels": {"team": "a", "kueue.x-k8s.io/queue-name": "q"}}


def test_the_queue_becomes_kueues_label_unless_the_label_names_another():
    document, warnings = converted_job(pytorchjob(workers=(1, TORCHRUN),
                                                  run_policy={"schedulingPolicy": {"queue": "team-a"}}))
    assert document["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert any("LocalQueue" in w for w in warnings)
    document, warnings = converted_job(pytorchjob(workers=(1, TORCHRUN), labels={"kueue.x-k8s.io/queue-name": "b"},
                                                  run_policy={"schedulingPolicy": {"queue": "team-a"}}))
    assert document["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "b"}
    assert any("queue team-a dropped" in w for w in warnings)


def test_the_priority_class_goes_to_the_pods():
    document, _ = converted_job(pytorchjob(workers=(1, TORCHRUN),
                                           run_policy={"schedulingPolicy": {"priorityClass": "high"}}))
    assert document["spec"]["template"]["spec"]["priorityClassName"] == "high"


def test_reserved_environment_is_removed_and_the_rest_kept():
    env = [{"name": "MASTER_ADDR", "value": "x"}, {"name": "PET_NNODES", "value": "2"},
           {"name": "NCCL_DEBUG", "value": "INFO"}]
    document, warnings = converted_job(pytorchjob(workers=(2, pod(["torchrun", "t.py"], env=env))))
    _, container = check_runs(document)
    assert container["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    assert any("MASTER_ADDR, PET_NNODES removed" in w for w in warnings)


def test_elastic_metrics_become_a_horizontal_pod_autoscaler_on_the_elasticjob():
    metrics = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                           "averageUtilization": 80}}}]
    result = convert_documents([pytorchjob(workers=(2, TORCHRUN), elastic={
        "minReplicas": 1, "maxReplicas": 4, "metrics": metrics})])
    job, hpa = result.documents
    assert hpa == {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                   "metadata": {"name": "train-elasticjob", "namespace": "ml"},
                   "spec": {"scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": "train"},
                            "minReplicas": 1, "maxReplicas": 4, "metrics": metrics}}


# (case, input, words the refusal must say)
REFUSALS = [
    ("a Master whose template differs from the Workers'",
     pytorchjob(workers=(2, pod(["torchrun", "t.py"], gpus=2)), master=pod(["torchrun", "t.py"], gpus=1)),
     ["spec.containers[0].resources.limits.nvidia.com/gpu: Master 1, Worker 2"]),
    ("two Masters", {**pytorchjob(workers=(1, TORCHRUN)), "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 2, "template": TORCHRUN}}}}, ["one Master"]),
    ("a replica type a PyTorchJob has not", {**pytorchjob(), "spec": {"pytorchReplicaSpecs": {
        "PS": {"replicas": 1, "template": TORCHRUN}}}}, ["PS", "not Master or Worker"]),
    ("no pytorch container", pytorchjob(workers=(1, pod(["torchrun", "t.py"], name="trainer"))),
     ["no container named 'pytorch'", "trainer"]),
    ("no command at all", pytorchjob(workers=(1, pod())), ["no command"]),
    ("python options torchrun does not take", pytorchjob(workers=(1, pod(["python", "-O", "t.py"]))), ["-O"]),
    ("nprocPerNode cpu", pytorchjob(workers=(1, TORCHRUN), nproc="cpu"), ["'cpu' has no equivalent"]),
    ("more processes than GPUs", pytorchjob(workers=(1, pod(["torchrun", "t.py"], gpus=1)), nproc="4"),
     ["operator would refuse", "nprocPerNode 4 exceeds the 1 GPUs"]),
    ("no image", pytorchjob(workers=(1, {"spec": {"containers": [{"name": "pytorch", "command": ["torchrun", "t.py"]}]}})),
     ["operator would refuse", "has no image"]),
    ("Workers outside the elastic range", pytorchjob(workers=(5, TORCHRUN), elastic={"minReplicas": 1,
                                                                                      "maxReplicas": 3}),
     ["5 pods", "1 to 3"]),
    ("minReplicas above maxReplicas", pytorchjob(workers=(2, TORCHRUN), elastic={"minReplicas": 3,
                                                                                  "maxReplicas": 2}),
     ["minReplicas 3 is above maxReplicas 2"]),
    ("a rendezvous timeout that is not a number", pytorchjob(workers=(1, TORCHRUN), elastic={
        "rdzvConf": [{"key": "join_timeout", "value": "10m"}]}), ["join_timeout='10m'"]),
    ("a value the model refuses", pytorchjob(workers=(1, TORCHRUN), elastic={
        "rdzvConf": [{"key": "keep_alive_max_attempt", "value": "1"}]}), ["keepAliveMaxAttempts"]),
    ("a TFJob", {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "tf"}},
     ["TFJob tf: only PyTorchJobs"]),
]


@pytest.mark.parametrize("case, job, words", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_what_would_run_differently_is_refused_with_what_to_change(case, job, words):
    with pytest.raises(ConversionError) as refused:
        convert_documents([job])
    for word in words:
        assert word in str(refused.value)


WARNINGS = [
    ("python now runs under torchrun", pytorchjob(workers=(1, PYTHON_DDP)), "now runs under torchrun"),
    ("no backoffLimit: unlimited before", pytorchjob(workers=(1, TORCHRUN)), "without limit"),
    ("etcd rendezvous", pytorchjob(workers=(1, TORCHRUN), elastic={"rdzvBackend": "etcd"}), "rdzvBackend etcd"),
    ("auto on a pod without GPUs", pytorchjob(workers=(1, TORCHRUN)), "torch's auto starts one process per CPU"),
    ("a gang", pytorchjob(workers=(1, TORCHRUN), run_policy={"schedulingPolicy": {"minAvailable": 1}}),
     "no gang is set"),
    ("ExitCode", {**pytorchjob(), "spec": {"pytorchReplicaSpecs": {
        "Worker": {"replicas": 1, "restartPolicy": "ExitCode", "template": TORCHRUN}}}}, "fatalExitCodes"),
    ("a shell command", pytorchjob(workers=(1, pod(["sh", "-c", "python t.py"]))), "runs as written"),
]


@pytest.mark.parametrize("case, job, words", WARNINGS, ids=[c[0] for c in WARNINGS])
def test_what_does_not_carry_over_is_said(case, job, words):
    result = convert_documents([job])
    check_runs(result.documents[0])
    assert any(words in w for w in result.warnings), result.warnings


def test_several_documents_convert_each_pytorchjob_and_pass_the_rest_through():
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "script"}, "data": {"t.py": ""}}
    other = pytorchjob(workers=(1, TORCHRUN))
    other["metadata"]["name"] = "second"
    text = yaml.safe_dump_all([config, pytorchjob(workers=(2, TORCHRUN)), None, other])
    result = convert_text(text)
    assert [(d["kind"], d["metadata"]["name"]) for d in result.documents] == [
        ("ConfigMap", "script"), ("ElasticJob", "train"), ("ElasticJob", "second")]
    assert list(yaml.safe_load_all(result.yaml())) == result.documents


def test_a_file_without_a_pytorchjob_is_refused():
    with pytest.raises(ConversionError, match="no PyTorchJob"):
        convert_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")


def test_the_command_prints_the_elasticjob_and_warns_on_stderr(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    # Two copies: safe_dump writes one object used twice as an anchor and an alias, which convert refuses.
    path.write_text(yaml.safe_dump(pytorchjob(workers=(1, PYTHON_DDP), master=copy.deepcopy(PYTHON_DDP))))
    assert main(["convert", str(path)]) == 0
    out, err = capsys.readouterr()
    (document,) = yaml.safe_load_all(out)
    check_runs(document)
    assert "warning: PyTorchJob train: the command" in err


def test_the_command_reads_stdin_and_refuses_with_the_reason(monkeypatch, capsys):
    job = pytorchjob(workers=(1, pod(["torchrun", "t.py"], name="trainer")))
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(job)))
    assert main(["convert", "-"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "elasticjob convert: -: PyTorchJob train: no container named 'pytorch'" in err
