"""`elasticjob convert` on input that is no PyTorchJob as its API defines it (issue 52): YAML that expands
("billion laughs"), too large or too deep, and fields of the wrong type. Each is refused at once with what and
where, never met as a traceback or a long wait."""

from __future__ import annotations

import copy
import re
import time

import pytest
import yaml
from test_convert import TORCHRUN, pod, pytorchjob

from elasticjob.cli import main
from elasticjob.convert import ConversionError, InputError, convert_documents, convert_text, safeyaml


def laughs(levels=9, width=9):
    """The billion laughs: 9 levels of 9 aliases, under 1 KB, a 9**9-item tree once walked; it sits in a template
    that the Master and the Worker share by an alias, so that the converter compares it with itself."""
    nested = ['x0: &x0 ["lol"]'] + [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    annotations = "\n".join(" " * 12 + line for line in nested)
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: laughs}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template: &t
        metadata:
          annotations:
{annotations}
        spec:
          containers: [{{name: pytorch, image: x, command: [torchrun, t.py]}}]
    Worker:
      replicas: 1
      template: *t
"""


def test_the_billion_laughs_is_refused_at_once():
    text = laughs()
    assert len(text) < 1024
    started = time.perf_counter()
    with pytest.raises(InputError, match="line 8: YAML anchor &t refused"):
        convert_text(text)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("text, words", [
    ("a: &x 1\n", "line 1: YAML anchor &x refused"),
    ("- 1\n- *x\n", "line 2: YAML alias *x refused"),  # an alias to no anchor: refused before PyYAML's own error
    ("a: " + "[" * 65 + "]" * 65, "nested more than 64 levels deep"),
    ("a: " + "[" * 100_000 + "]" * 100_000, "nested more than 64 levels deep"),  # not a RecursionError
    ("#" * (safeyaml.MAX_CHARS + 1), "at most 1048576 (1 MiB) are read"),
    ("a: [1\n", "not YAML"),
])
def test_yaml_that_expands_or_nests_without_end_is_refused(text, words):
    with pytest.raises(InputError, match=re.escape(words)):
        convert_text(text)


def test_a_value_used_twice_is_written_twice_so_that_the_output_reads_back():
    labels = {"team": "a"}
    documents = [{"kind": "ConfigMap", "metadata": {"labels": labels, "annotations": labels}}]
    assert "&" not in safeyaml.dump_all(documents)
    assert safeyaml.load_all(safeyaml.dump_all(documents)) == documents


def worker(job):
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def set_at(job, path, value):
    """A copy of `job` with the field at `path` set (the test_convert templates are shared: never changed)."""
    job = copy.deepcopy(job)
    node = job
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return job


CONTAINER = ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0)
# (the field set, its value, the message expected)
WRONG = [
    (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), "two",
     "spec.pytorchReplicaSpecs.Worker.replicas: expected a whole number, found the string 'two'"),
    (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), 2.5, "replicas: expected a whole number, found the number 2.5"),
    (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), True, "replicas: expected a whole number, found true"),
    (("spec", "pytorchReplicaSpecs"), [{"replicas": 1}], "spec.pytorchReplicaSpecs: expected a mapping, found a list"),
    (("spec", "pytorchReplicaSpecs", "Worker"), "x", "spec.pytorchReplicaSpecs.Worker: expected a mapping"),
    (("spec", "pytorchReplicaSpecs", 1), {"replicas": 1}, "pytorchReplicaSpecs: expected a mapping, found a "
                                                           "mapping with the key 1, not a string"),
    (("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers"), {"name": "pytorch"},
     "template.spec.containers: expected a list, found a mapping"),
    ((*CONTAINER, "command"), "torchrun t.py", "containers[0].command: expected a list, found the string"),
    ((*CONTAINER, "args"), ["--steps", 60], "containers[0].args[1]: expected a string, found the number 60"),
    ((*CONTAINER, "env"), [{"name": ["PET_NNODES"]}], "containers[0].env[0].name: expected a string, found a list"),
    ((*CONTAINER, "resources"), {"limits": {"nvidia.com/gpu": "two"}},
     "containers[0].resources.limits.nvidia.com/gpu: expected a whole number of GPUs, found the string 'two'"),
    (("spec", "elasticPolicy"), {"maxReplicas": "4"}, "spec.elasticPolicy.maxReplicas: expected a whole number"),
    (("spec", "elasticPolicy"), {"rdzvConf": {"join_timeout": "9"}}, "rdzvConf: expected a list, found a mapping"),
    (("spec", "elasticPolicy"), {"rdzvConf": [{"key": ["join_timeout"], "value": "9"}]},
     "spec.elasticPolicy.rdzvConf[0].key: expected a string, found a list"),
    (("spec", "runPolicy"), {"schedulingPolicy": ["q"]}, "spec.runPolicy.schedulingPolicy: expected a mapping"),
    (("spec", "runPolicy"), {"backoffLimit": "3"}, "spec.runPolicy.backoffLimit: expected a whole number"),
    (("spec",), "none", "spec: expected a mapping, found the string 'none'"),
    (("metadata", "labels"), ["a"], "metadata.labels: expected a mapping, found a list"),
]


@pytest.mark.parametrize("path, value, words", WRONG, ids=[w[2][:60] for w in WRONG])
def test_a_field_of_the_wrong_type_is_refused_by_its_path(path, value, words):
    with pytest.raises(InputError) as refused:
        convert_documents([set_at(pytorchjob(workers=(2, TORCHRUN)), path, value)])
    assert str(refused.value).startswith("PyTorchJob train: ")
    assert words in str(refused.value)


@pytest.mark.parametrize("document, words", [
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": ["x"]}, "document 1: metadata: expected a mapping"),
    ({"apiVersion": ["v1"], "kind": "ConfigMap"}, "document 1: apiVersion: expected a string"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 7}}, "document 1: metadata.name: expected a"),
])
def test_any_document_with_a_wrong_type_where_every_object_has_a_string_is_refused(document, words):
    with pytest.raises(InputError, match=words):
        convert_documents([document])


def every_field(node, path=()):
    """Each field's path in a manifest, items of lists included."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield (*path, key)
        yield from every_field(child, (*path, key))


def rich_job():
    """A PyTorchJob that sets every field the converter reads."""
    template = pod(["python", "-u", "t.py"], args=["--lr", "0.1"], gpus=1, env=[{"name": "NCCL_DEBUG", "value": "1"}])
    kubeflow = {"labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": "train"}, "matchExpressions": [
        {"key": "training.kubeflow.org/replica-type", "operator": "In", "values": ["worker"]}]},
        "matchLabelKeys": ["job-name"], "mismatchLabelKeys": ["group-name"], "topologyKey": "kubernetes.io/hostname"}
    template["spec"]["affinity"] = {kind: {
        "requiredDuringSchedulingIgnoredDuringExecution": [copy.deepcopy(kubeflow)],
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": copy.deepcopy(kubeflow)}]}
        for kind in ("podAffinity", "podAntiAffinity")}
    template["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, **copy.deepcopy(kubeflow)}]
    job = pytorchjob(workers=(2, template), master=copy.deepcopy(template), nproc="1", labels={"team": "a"},
                     annotations={"owner": "me"}, generateName="t-", elastic={
                         "minReplicas": 1, "maxReplicas": 3, "maxRestarts": 2, "nProcPerNode": 1, "rdzvBackend": "c10d",
                         "rdzvHost": "h", "rdzvId": "i", "rdzvPort": 29400, "standalone": False,
                         "rdzvConf": [{"key": "join_timeout", "value": "60"}, {"key": "is_host", "value": "x"}],
                         "metrics": [{"type": "Resource"}]},
                     run_policy={"backoffLimit": 3, "suspend": False, "activeDeadlineSeconds": 60,
                                 "ttlSecondsAfterFinished": 60, "cleanPodPolicy": "All", "managedBy": "x",
                                 "schedulingPolicy": {"queue": "q", "priorityClass": "p", "minAvailable": 1,
                                                      "scheduleTimeoutSeconds": 9, "minResources": {"cpu": 1}}})
    job["spec"].update({"cleanPodPolicy": "All", "backoffLimit": 3, "activeDeadlineSeconds": 60,
                        "ttlSecondsAfterFinished": 60})  # where the pytorch-operator's kubeflow.org/v1 had them
    convert_documents([copy.deepcopy(job)])  # it converts as it is
    return job


ODD_VALUES = ["two", "", "²", -1, 2.5, True, None, ["x"], [], {"x": 1}, {1: "x"}, {}]


@pytest.mark.parametrize("path", list(every_field(rich_job())), ids=lambda p: ".".join(map(str, p)))
def test_no_field_of_any_type_escapes_as_a_traceback(path):
    """Every field the converter reads is in shape.py's table: none reaches the converter's own catch-all, whose
    message cannot name the field."""
    replica = path[:3] in {("spec", "pytorchReplicaSpecs", kind) for kind in ("Master", "Worker")}
    twin = (*path[:2], {"Master": "Worker", "Worker": "Master"}[path[2]], *path[3:]) if replica else path
    for value in ODD_VALUES:
        try:  # set in both replicas alike: a Master that differs from the Workers is refused before any other
            convert_documents([set_at(set_at(rich_job(), path, value), twin, value)])
        except ConversionError as error:
            assert "is not of the type its API defines" not in str(error), (value, str(error))


def test_null_replicas_count_as_unset():
    job = pytorchjob(workers=(2, TORCHRUN), master=copy.deepcopy(TORCHRUN))
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = None
    worker(job)["replicas"] = None
    assert convert_documents([job]).documents[0]["spec"]["minReplicas"] == 2


@pytest.mark.parametrize("flag", ["--max-restarts=many", "--max-restarts=²"])
def test_a_torchrun_flag_that_should_be_a_number_is_refused_by_name(flag):
    with pytest.raises(ConversionError, match=f"--max-restarts '{flag.split('=')[1]}' is not a whole number"):
        convert_documents([pytorchjob(workers=(1, pod(["torchrun", flag, "t.py"])))])


def test_nproc_per_node_in_digits_of_another_script_is_refused():
    with pytest.raises(ConversionError, match="nprocPerNode '²' has no equivalent"):
        convert_documents([pytorchjob(workers=(1, TORCHRUN), nproc="²")])


def test_the_command_names_the_field_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(set_at(pytorchjob(workers=(2, TORCHRUN)),
                                          ("spec", "pytorchReplicaSpecs", "Worker", "replicas"), "two")))
    assert main(["convert", str(path)]) != 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"elasticjob convert: {path}: PyTorchJob train: spec.pytorchReplicaSpecs.Worker.replicas: "
                   "expected a whole number, found the string 'two'\n")


@pytest.mark.parametrize("text", [laughs(), "kind: [\n", "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nspec: []\n"])
def test_the_command_exits_2_on_input_that_is_no_pytorchjob(tmp_path, text, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["convert", str(path)]) == 2


def test_the_command_still_exits_1_on_a_job_it_cannot_convert(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(pytorchjob(workers=(1, pod(["torchrun", "t.py"], name="trainer")))))
    assert main(["convert", str(path)]) == 1
