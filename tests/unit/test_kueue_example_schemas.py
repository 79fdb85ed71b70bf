"""The Kueue set-up shipped in examples/kueue/ is what Kueue and the operator accept: each Kueue object validates
against the schema of Kueue's own CRDs (those the local cluster installs, v0.19.2) with unknown fields refused,
as the API server's strict field validation does; the RBAC against the Kubernetes API schemas; the example job
parses with the operator's model, names the example LocalQueue, and the Workload the operator would make for it
validates too and asks only for resources the example ClusterQueue covers. The Helm values for Kueue's chart
carry the local cluster's externalFrameworks entry, and docs/scheduling.md shows them as they are.

The CRDs' CEL rules (x-kubernetes-validations) are not evaluated here; tests/integration/test_kueue_examples.py
applies the objects to the real API server with Kueue's webhooks.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from elasticjob.domain import JobRef
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import workloads
from elasticjob.models import ElasticJobSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kueue"
KUEUE_CRDS = ROOT / "localcluster" / "manifests" / "kueue"
LOCAL_KUEUE_CONFIG = ROOT / "localcluster" / "kueue" / "config.yaml"
DOCS = ROOT / "docs" / "scheduling.md"
KUEUE_GROUP = "kueue.x-k8s.io"
KUBE_VERSION = "1.36"


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if path.name == "kueue-values.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


def only(kind: str) -> dict[str, Any]:
    (doc,) = [doc for _, doc in documents() if doc["kind"] == kind]
    return doc


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever the CRD lists an object's fields and does not keep unknown
    ones: a misspelt field fails here as `kubectl apply` (strict field validation) would."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@functools.cache
def crds() -> dict[str, dict[str, Any]]:
    """Kueue's CRDs by kind, read once (the Workload's is 1.4 MB: the C loader where PyYAML has it)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found = {}
    for path in KUEUE_CRDS.glob(f"{KUEUE_GROUP}_*.yaml"):
        for crd in yaml.load_all(path.read_text(), Loader=loader):
            found[crd["spec"]["names"]["kind"]] = crd
    return found


def crd_schema(kind: str, version: str) -> dict[str, Any]:
    assert kind in crds(), f"no CRD for {kind} in {KUEUE_CRDS}"
    (served,) = [v for v in crds()[kind]["spec"]["versions"] if v["name"] == version and v["served"]]
    return strict(served["schema"]["openAPIV3Schema"])


def validate_kueue(doc: dict[str, Any]) -> None:
    group, version = doc["apiVersion"].split("/")
    assert group == KUEUE_GROUP, doc["apiVersion"]
    body = {key: value for key, value in doc.items() if key != "metadata"}  # metadata is the API server's own
    jsonschema.validate(body, crd_schema(doc["kind"], version))


KUEUE_DOCS = [(name, doc) for name, doc in documents() if doc["apiVersion"].startswith(f"{KUEUE_GROUP}/")]
KUBE_DOCS = [(name, doc) for name, doc in documents() if doc["apiVersion"].startswith("rbac.authorization.k8s.io/")]


def test_the_examples_hold_a_flavor_a_cluster_queue_a_local_queue_and_a_queued_job() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["ClusterQueue", "ClusterRole", "ClusterRoleBinding", "ElasticJob", "LocalQueue",
                     "ResourceFlavor", "WorkloadPriorityClass", "WorkloadPriorityClass"]


@pytest.mark.parametrize("name, doc", KUEUE_DOCS, ids=[name for name, _ in KUEUE_DOCS])
def test_a_kueue_example_validates_against_kueues_crd(name: str, doc: dict[str, Any]) -> None:
    validate_kueue(doc)


@pytest.mark.parametrize("name, doc", KUBE_DOCS, ids=[name for name, _ in KUBE_DOCS])
def test_the_rbac_example_validates_against_the_kubernetes_api(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_a_misspelt_field_is_refused() -> None:
    queue = copy.deepcopy(only("ClusterQueue"))
    queue["spec"]["preemption"]["withinClusterQueu"] = queue["spec"]["preemption"].pop("withinClusterQueue")
    with pytest.raises(jsonschema.ValidationError, match="withinClusterQueu"):
        validate_kueue(queue)


def test_the_queues_and_the_flavor_point_at_each_other() -> None:
    flavor, cluster_queue, local_queue = only("ResourceFlavor"), only("ClusterQueue"), only("LocalQueue")
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert set(group["coveredResources"]) == {"cpu", "memory", "nvidia.com/gpu"}
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    assert local_queue["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    # Preemption within the queue by priority: what the operator's eviction handling (checkpoint, resume) is for.
    assert cluster_queue["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    priorities = [doc["metadata"]["name"] for _, doc in documents() if doc["kind"] == "WorkloadPriorityClass"]
    assert priorities == ["training-high", "training-low"]


def job_ref(doc: dict[str, Any]) -> JobRef:
    meta = doc["metadata"]
    return JobRef(namespace=meta["namespace"], name=meta["name"], uid="0000-example",
                  spec=ElasticJobSpec.model_validate(doc["spec"]), labels=tuple(sorted(meta["labels"].items())))


def test_the_example_job_queues_in_the_example_local_queue() -> None:
    job, local_queue = only("ElasticJob"), only("LocalQueue")
    ref = job_ref(job)
    assert workloads.queue_name(dict(ref.labels)) == local_queue["metadata"]["name"]
    assert ref.namespace == local_queue["metadata"]["namespace"]
    assert ref.spec.min_replicas < ref.spec.desired_replicas  # room for partial admission and for slices


def test_the_operators_workload_for_the_example_job_fits_the_example_cluster_queue() -> None:
    ref = job_ref(only("ElasticJob"))
    body = workloads.workload(ref, workloads.queue_name(dict(ref.labels)) or "", None)
    validate_kueue(body)
    (group,) = only("ClusterQueue")["spec"]["resourceGroups"]
    for pod_set in body["spec"]["podSets"]:
        spec = pod_set["template"]["spec"]
        asked = {key for container in [*spec["containers"], *spec.get("initContainers", [])]
                 for key in ((container.get("resources") or {}).get("requests") or {})}
        # Kueue cannot admit a Workload asking for a resource its ClusterQueue does not cover.
        assert asked <= set(group["coveredResources"]), (pod_set["name"], asked)
    workers = next(p for p in body["spec"]["podSets"] if p["name"] == kueue_names.PODSET_WORKERS)
    assert workers["minCount"] == ref.spec.min_replicas


def values() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "kueue-values.yaml").read_text())


def test_kueues_values_carry_the_local_clusters_external_framework_and_the_slices_gate() -> None:
    manager = yaml.safe_load(values()["managerConfig"]["controllerManagerConfigYaml"])
    local = yaml.safe_load(LOCAL_KUEUE_CONFIG.read_text())
    assert manager["integrations"]["externalFrameworks"] == local["integrations"]["externalFrameworks"]
    assert "featureGates" not in manager  # Kueue refuses gates in both the configuration and the flags
    assert {"name": "ElasticJobsViaWorkloadSlices", "enabled": True} in values()["controllerManager"]["featureGates"]


def test_the_docs_show_kueues_values_as_shipped() -> None:
    section = DOCS.read_text().split("## Set up Kueue", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert (EXAMPLES / "kueue-values.yaml").read_text() in blocks
    for path in sorted(EXAMPLES.glob("*.yaml")):
        assert f"(../examples/kueue/{path.name})" in section, path.name
