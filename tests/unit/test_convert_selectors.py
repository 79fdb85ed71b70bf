"""`elasticjob convert`: pod affinity and topology spread selectors on Kubeflow's pod labels.

The training operator labels a PyTorchJob's pods `training.kubeflow.org/job-name`, `replica-type` (master, worker),
`replica-index`, `operator-name` and, on the Master, `job-role`, with the same keys unprefixed (deprecated:
`job-name`, `replica-type`, `replica-index`, `group-name`, `job-role`), and the pytorch-operator before it
`pytorch-job-name`, `pytorch-replica-type`, `pytorch-replica-index`, `controller-name`. An ElasticJob's worker
pods carry `elasticjob.dev/job-name`, `elasticjob.dev/role: worker` and their own index. A selector on Kubeflow's
labels copied as it was selects none of them: a required podAffinity leaves every pod Pending, spreading and
anti-affinity do nothing. Each is rewritten where the rewrite means the same, and kept with a warning naming it
where it cannot.
"""

from __future__ import annotations

import copy

import pytest
from test_convert import TORCHRUN, check_runs, converted_job, pytorchjob
from test_pod_template_schema import crd_schema, errors

from elasticjob import naming

JOB, ROLE = naming.JOB_LABEL, naming.ROLE_LABEL
KF_JOB, KF_TYPE = "training.kubeflow.org/job-name", "training.kubeflow.org/replica-type"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
HOST = "kubernetes.io/hostname"


def expression(key, operator, *values):
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def term(match_labels=None, expressions=None, **keys):
    selector = {}
    if match_labels is not None:
        selector["matchLabels"] = match_labels
    if expressions is not None:
        selector["matchExpressions"] = expressions
    return {"labelSelector": selector, "topologyKey": HOST, **keys}


def with_template_spec(**pod_spec):
    template = copy.deepcopy(TORCHRUN)
    template["spec"].update(pod_spec)
    return pytorchjob(workers=(2, template), master=copy.deepcopy(template))


def affinity_job(kind, where, the_term):
    placed = [the_term] if where == REQUIRED else [{"weight": 100, "podAffinityTerm": the_term}]
    return with_template_spec(affinity={kind: {where: placed}})


def converted_term(kind, where, the_term):
    document, warnings = converted_job(affinity_job(kind, where, the_term))
    check_runs(document)
    assert errors(crd_schema(), document) == []
    placed = document["spec"]["template"]["spec"]["affinity"][kind][where][0]
    return (placed if where == REQUIRED else placed["podAffinityTerm"]), warnings


# (case, the term in the PyTorchJob, the term in the ElasticJob, words a warning says)
REWRITTEN = [
    ("job-name In [this job]: its workers",
     term(expressions=[expression(KF_JOB, "In", "train")]),
     term(match_labels={ROLE: "worker"}, expressions=[expression(JOB, "In", "train")]),
     ["rewritten", f"{KF_JOB} in (train)", f"{JOB} in (train)", f"{ROLE}=worker"]),
    ("job name and replica type as matchLabels",
     term(match_labels={KF_JOB: "train", KF_TYPE: "worker"}),
     term(match_labels={JOB: "train", ROLE: "worker"}), ["rewritten"]),
    ("the deprecated unprefixed labels and group-name, which the job's name implies",
     term(match_labels={"job-name": "train", "group-name": "kubeflow.org", "replica-type": "worker"}),
     term(match_labels={JOB: "train", ROLE: "worker"}), ["rewritten"]),
    ("the pytorch-operator's labels",
     term(match_labels={"pytorch-job-name": "train", "controller-name": "pytorch-operator"},
          expressions=[expression("pytorch-replica-type", "In", "master", "worker")]),
     term(match_labels={JOB: "train"}, expressions=[expression(ROLE, "In", "worker")]), ["rewritten"]),
    ("the operator-name label, implied by the job's name",
     term(match_labels={KF_JOB: "train", "training.kubeflow.org/operator-name": "pytorchjob-controller"}),
     term(match_labels={JOB: "train", ROLE: "worker"}), ["rewritten"]),
    ("the same requirement under two of Kubeflow's keys is written once",
     term(match_labels={KF_JOB: "train", "job-name": "train"},
          expressions=[expression(KF_JOB, "In", "train"), expression("job-name", "In", "train")]),
     term(match_labels={JOB: "train", ROLE: "worker"}, expressions=[expression(JOB, "In", "train")]),
     ["rewritten"]),
    ("replica type Master: every worker now, said",
     term(match_labels={KF_JOB: "train", KF_TYPE: "master"}),
     term(match_labels={JOB: "train", ROLE: "worker"}), ["the Master alone", "every worker"]),
    ("replica type Exists within the job",
     term(match_labels={KF_JOB: "train"}, expressions=[expression(KF_TYPE, "Exists")]),
     term(match_labels={JOB: "train"}, expressions=[expression(ROLE, "In", "worker")]), ["rewritten"]),
    ("matchLabelKeys job-name: the incoming pod's own job",
     term(match_labels={"app": "bert"}, matchLabelKeys=[KF_JOB]),
     term(match_labels={"app": "bert", ROLE: "worker"}, matchLabelKeys=[JOB]), ["rewritten", "matchLabelKeys"]),
    ("matchLabelKeys replica-type beside the job's name: the role, not added twice",
     term(match_labels={KF_JOB: "train"}, matchLabelKeys=[KF_TYPE]),
     term(match_labels={JOB: "train"}, matchLabelKeys=[ROLE]), ["rewritten"]),
    ("a matchLabelKeys entry the selector already pins is left out",
     term(match_labels={KF_JOB: "train"}, matchLabelKeys=["job-name"]),
     term(match_labels={JOB: "train", ROLE: "worker"}), ["rewritten"]),
    ("mismatchLabelKeys job-name: pods of other jobs, as before",
     term(match_labels={"team": "nlp"}, mismatchLabelKeys=[KF_JOB]),
     term(match_labels={"team": "nlp"}, mismatchLabelKeys=[JOB]), ["rewritten"]),
    ("job-name NotIn [this job]: every pod but the job's, as before",
     term(expressions=[expression(KF_JOB, "NotIn", "train")]),
     term(expressions=[expression(JOB, "NotIn", "train")]), ["rewritten"]),
]


@pytest.mark.parametrize("kind", ["podAffinity", "podAntiAffinity"])
@pytest.mark.parametrize("where", [REQUIRED, PREFERRED])
@pytest.mark.parametrize("case, before, after, words", REWRITTEN, ids=[c[0] for c in REWRITTEN])
def test_a_selector_of_the_jobs_own_pods_is_rewritten_to_the_operators_labels(kind, where, case, before, after,
                                                                                words):
    placed, warnings = converted_term(kind, where, before)
    assert placed == after
    said = [w for w in warnings if f"affinity.{kind}.{where}[0]" in w]
    assert len(said) == 1, warnings
    for word in words:
        assert word in said[0]


# (case, the term, words the warning says); each term is kept as it was written
KEPT = [
    ("replica-index: no equivalent",
     term(match_labels={KF_JOB: "train", "training.kubeflow.org/replica-index": "0"}),
     ["training.kubeflow.org/replica-index=0", "no equivalent", "matches none of this job's pods"]),
    ("job-role master: no Master here",
     term(match_labels={"training.kubeflow.org/job-role": "master", KF_JOB: "train"}),
     ["training.kubeflow.org/job-role=master", "no Master"]),
    ("a replica type a PyTorchJob has not", term(match_labels={KF_JOB: "train", KF_TYPE: "ps"}),
     [f"{KF_TYPE}=ps", "no equivalent"]),
    ("replica type NotIn", term(match_labels={KF_JOB: "train"}, expressions=[expression(KF_TYPE, "NotIn", "master")]),
     [f"{KF_TYPE} notin (master)"]),
    ("mismatchLabelKeys replica-type: every pod here is a worker",
     term(match_labels={KF_JOB: "train"}, mismatchLabelKeys=[KF_TYPE]), ["mismatchLabelKeys " + KF_TYPE]),
    ("a replica type across every PyTorchJob: this job's pods no longer carry it",
     term(match_labels={KF_TYPE: "worker"}), [f"{KF_TYPE}=worker", "every PyTorchJob"]),
    ("the job's name among others", term(expressions=[expression(KF_JOB, "In", "train", "eval")]),
     [f"{KF_JOB} in (train, eval)"]),
    ("any Kubeflow job", term(expressions=[expression(KF_JOB, "Exists")]), [KF_JOB]),
]


@pytest.mark.parametrize("case, before, words", KEPT, ids=[c[0] for c in KEPT])
def test_a_selector_that_cannot_be_rewritten_is_kept_and_named(case, before, words):
    placed, warnings = converted_term("podAntiAffinity", PREFERRED, before)
    assert placed == before
    said = [w for w in warnings if f"affinity.podAntiAffinity.{PREFERRED}[0]" in w]
    assert len(said) == 1, warnings
    assert "kept as written" in said[0]
    for word in words:
        assert word in said[0], said[0]


def test_a_required_pod_affinity_that_cannot_be_rewritten_says_the_pods_stay_pending():
    before = term(match_labels={KF_JOB: "train", "training.kubeflow.org/replica-index": "0"})
    placed, warnings = converted_term("podAffinity", REQUIRED, before)
    assert placed == before
    assert any("Pending" in w for w in warnings), warnings


def test_a_selector_of_another_pytorchjobs_pods_is_kept_with_a_notice():
    before = term(match_labels={KF_JOB: "preprocess"})
    placed, warnings = converted_term("podAffinity", PREFERRED, before)
    assert placed == before
    (said,) = [w for w in warnings if "affinity.podAffinity" in w]
    assert "kept as written" in said and "PyTorchJob preprocess" in said and JOB in said


def test_a_selector_without_kubeflows_labels_is_left_alone_and_not_mentioned():
    before = term(match_labels={"app": "bert"}, expressions=[expression(JOB, "In", "train")])
    placed, warnings = converted_term("podAntiAffinity", REQUIRED, before)
    assert placed == before
    assert not any("affinity" in w for w in warnings), warnings


def test_without_a_name_the_jobs_own_selector_cannot_be_told_and_is_kept():
    job = affinity_job("podAffinity", PREFERRED, term(match_labels={KF_JOB: "train"}))
    del job["metadata"]["name"]
    job["metadata"]["generateName"] = "train-"
    document, warnings = converted_job(job)
    assert document["spec"]["template"]["spec"]["affinity"] == job["spec"]["pytorchReplicaSpecs"]["Worker"][
        "template"]["spec"]["affinity"]
    assert any("affinity.podAffinity" in w and "kept as written" in w for w in warnings), warnings


def spread(selector=None, **keys):
    constraint = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
    if selector is not None:
        constraint["labelSelector"] = selector
    return {**constraint, **keys}


def test_topology_spread_constraints_are_rewritten_each_and_warned_each():
    job = with_template_spec(topologySpreadConstraints=[
        spread({"matchLabels": {KF_JOB: "train", KF_TYPE: "worker"}}),
        spread({"matchLabels": {"app": "bert"}}, matchLabelKeys=[KF_JOB]),
        spread({"matchLabels": {"training.kubeflow.org/replica-index": "0"}}),
        spread({"matchLabels": {"app": "bert"}}),
        spread(),
    ])
    document, warnings = converted_job(job)
    check_runs(document)
    assert errors(crd_schema(), document) == []
    assert document["spec"]["template"]["spec"]["topologySpreadConstraints"] == [
        spread({"matchLabels": {JOB: "train", ROLE: "worker"}}),
        spread({"matchLabels": {"app": "bert", ROLE: "worker"}}, matchLabelKeys=[JOB]),
        spread({"matchLabels": {"training.kubeflow.org/replica-index": "0"}}),
        spread({"matchLabels": {"app": "bert"}}),
        spread(),
    ]
    said = [w for w in warnings if "topologySpreadConstraints" in w]
    assert [w.split(": ")[1] for w in said] == [f"template.spec.topologySpreadConstraints[{i}]" for i in range(3)]
    assert "rewritten" in said[0] and "rewritten" in said[1] and "kept as written" in said[2]


def test_node_affinity_and_the_namespace_selector_are_not_pod_labels_and_stay():
    node = {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expression(KF_TYPE, "In", "worker")]}]}}
    the_term = {**term(match_labels={KF_JOB: "train"}), "namespaceSelector": {"matchLabels": {KF_JOB: "x"}}}
    document, _ = converted_job(with_template_spec(affinity={"nodeAffinity": node,
                                                             "podAffinity": {REQUIRED: [the_term]}}))
    affinity = document["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node
    assert affinity["podAffinity"][REQUIRED][0] == {**term(match_labels={JOB: "train", ROLE: "worker"}),
                                                    "namespaceSelector": {"matchLabels": {KF_JOB: "x"}}}


def test_the_input_is_left_as_it_was():
    job = affinity_job("podAntiAffinity", REQUIRED, term(match_labels={KF_JOB: "train"}))
    before = copy.deepcopy(job)
    converted_job(job)
    assert job == before
