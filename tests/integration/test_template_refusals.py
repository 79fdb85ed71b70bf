"""spec.template carries Kubernetes' PodTemplateSpec schema, and the real API server acts on it: it accepts the CRD
(structural, its list markers and defaults as it requires), refuses a misspelt template field under strict field
validation (kubectl's default) and prunes it with a warning otherwise (an API client's default), and publishes the
template's fields in its OpenAPI, so that `kubectl explain` answers. The schema's own checks are unit tests
(tests/unit/test_pod_template_schema.py)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from jobapi import GROUP, PLURAL, VERSION, job_manifest
from kubernetes.client.exceptions import ApiException

from elasticjob import rest
from helpers import wait_for

MISSPELT = 'unknown field "spec.template.spec.containers[0].resorces"'


def misspelt(name: str) -> dict:
    manifest = job_manifest(name)
    manifest["spec"]["template"]["spec"]["containers"][0]["resorces"] = {"limits": {"cpu": "1"}}
    return manifest


def create(kube, namespace: str, manifest: dict, field_validation: str):
    """POST with the given fieldValidation; the urllib3 response (its Warning header is what kubectl prints)."""
    path = rest.resource(f"{GROUP}/{VERSION}", namespace, PLURAL)
    return rest.call(kube, "POST", path, query={"fieldValidation": field_validation}, body=manifest)


def test_strict_field_validation_refuses_a_misspelt_template_field(kube, namespace, crds_installed):
    with pytest.raises(ApiException) as err:
        create(kube, namespace, misspelt("strict"), "Strict")
    assert err.value.status == 400 and MISSPELT in json.loads(err.value.body)["message"], err.value.body


def test_otherwise_the_field_is_pruned_with_a_warning(kube, namespace, crds_installed):
    """The API server's default for a client that asks for nothing (the operator's own writes among them)."""
    response = create(kube, namespace, misspelt("warned"), "Warn")
    container = json.loads(response.data)["spec"]["template"]["spec"]["containers"][0]
    assert "resorces" not in container and container["resources"] == {"requests": {"cpu": "100m"}}
    # RFC 7234's warn-text is a quoted string: the field's own quotes come escaped.
    assert MISSPELT.replace('"', '\\"') in response.headers.get("Warning", ""), dict(response.headers)


def test_kubectl_refuses_a_misspelt_template_field(namespace, crds_installed, cluster):
    applied = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "apply", "-n",
                              namespace, "-f", "-"], input=yaml.safe_dump(misspelt("kubectl")),
                             capture_output=True, text=True, timeout=60)
    assert applied.returncode != 0 and MISSPELT in applied.stderr, applied.stderr


def test_a_templates_container_ports_get_their_protocol(api, namespace, crds_installed):
    """The one default the schema keeps (a map list's key must have one); the API server fills it in."""
    manifest = job_manifest("ports")
    manifest["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 29500}]
    job = api[0].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    assert job["spec"]["template"]["spec"]["containers"][0]["ports"] == [{"containerPort": 29500, "protocol": "TCP"}]


def published_container(kube) -> dict:
    """The container schema in the API server's OpenAPI v3 for the group (what `kubectl explain` reads)."""
    schemas = json.loads(rest.call(kube, "GET", f"/openapi/v3/apis/{GROUP}/{VERSION}").data)["components"]["schemas"]
    job = schemas[f"dev.elasticjob.{VERSION}.ElasticJob"]
    spec = job["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    return spec["properties"]["containers"]["items"]


def test_the_openapi_publishes_the_templates_fields(kube, crds_installed):
    container = wait_for(lambda: published_container(kube), 30, "the template's containers in /openapi/v3",
                         until=lambda c: "resources" in c.get("properties", {}), ignore=(KeyError,))
    resources = container["properties"]["resources"]
    assert {"limits", "requests"} <= set(resources["properties"]) and resources["description"]


def test_kubectl_explain_answers_for_the_template(namespace, crds_installed, cluster):
    def explain() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "explain",
                               "elasticjobs.spec.template.spec.containers.resources"],
                              capture_output=True, text=True, timeout=60)

    out = wait_for(explain, 30, "kubectl explain of the template's resources", until=lambda r: r.returncode == 0)
    assert "limits" in out.stdout and "requests" in out.stdout, out.stdout
