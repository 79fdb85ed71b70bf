"""The models are the source of truth: the generated CRD matches them, and examples parse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from elasticjob import crd, integrations
from elasticjob.models import ElasticJobSpec, ElasticJobStatus

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "elasticjob.dev_elasticjobs.yaml"
CHART_CRD_FILE = ROOT / "charts" / "elasticjob-operator" / "crds" / "elasticjob.dev_elasticjobs.yaml"


def test_crd_file_matches_the_models():
    assert CRD_FILE.read_text() == crd.crd_yaml(integrations.status_parts()), "crds/ drifted from elasticjob.models: run `make crds`"


def test_chart_crd_matches_the_models():
    assert CHART_CRD_FILE.read_text() == crd.crd_yaml(integrations.status_parts()), "the chart's CRD drifted: run `make crds`"


def test_crd_has_subresources_printer_columns_and_rules():
    version = crd.crd(integrations.status_parts())["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.selector"}
    assert [c["name"] for c in version["additionalPrinterColumns"]][:7] == [
        "Phase", "Ready", "Desired", "Spares", "Min", "Max", "Restarts"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert {r["rule"] for r in spec["x-kubernetes-validations"]} == {r["rule"] for r in crd.SPEC_RULES}
    assert spec["properties"]["nprocPerNode"]["x-kubernetes-int-or-string"] is True
    assert spec["properties"]["rendezvous"]["default"] == {}


def _no_refs_or_nulls(node):
    if isinstance(node, dict):
        assert "$ref" not in node and "anyOf" not in node and node.get("type") != "null", node
        for value in node.values():
            _no_refs_or_nulls(value)
    elif isinstance(node, list):
        for value in node:
            _no_refs_or_nulls(value)


def test_schema_is_structural():
    _no_refs_or_nulls(crd.crd(integrations.status_parts()))


def test_example_parses_with_the_defaults_we_document():
    doc = yaml.safe_load((ROOT / "examples" / "elasticjob.yaml").read_text())
    spec = ElasticJobSpec.model_validate(doc["spec"])
    assert (spec.min_replicas, spec.max_replicas, spec.desired_replicas) == (1, 3, 2)
    assert spec.rendezvous.port == 29400 and spec.rendezvous.keep_alive_interval_seconds == 1


def test_example_hpa_drives_the_example_job_within_its_bounds():
    job = yaml.safe_load((ROOT / "examples" / "elasticjob.yaml").read_text())
    hpa = yaml.safe_load((ROOT / "examples" / "hpa.yaml").read_text())
    spec = ElasticJobSpec.model_validate(job["spec"])
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": job["apiVersion"], "kind": job["kind"],
                                             "name": job["metadata"]["name"]}
    assert spec.min_replicas <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] <= spec.max_replicas


@pytest.mark.parametrize("bad", [
    {"maxReplicas": 0},
    {"minReplicas": 0},
    {"maxRestarts": -1},
    {"nprocPerNode": "all"},
    {"rendezvous": {"keepAliveMaxAttempts": 1}},
    {"rendezvous": {"port": 70000}},
])
def test_invalid_specs_are_rejected_by_the_model(bad):
    data = {"minReplicas": 1, "maxReplicas": 2, "template": {"spec": {"containers": [{"name": "w"}]}}}
    with pytest.raises(ValidationError):
        ElasticJobSpec.model_validate({**data, **bad})


def test_status_round_trips_through_the_wire_format():
    status = ElasticJobStatus.model_validate({"phase": "Running", "readyReplicas": 2,
                                              "lastFailures": [{"pod": "p", "uid": "u", "reason": "Error"}]})
    assert ElasticJobStatus.model_validate(status.wire()) == status
    assert status.wire()["readyReplicas"] == 2
