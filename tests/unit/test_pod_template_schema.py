"""spec.template is Kubernetes' own PodTemplateSpec (podschema.py: the OpenAPI v3 document of the release the local
cluster builds, resolved and vendored): structural as the API server requires of a CRD; strict about misspelt
fields as `kubectl apply` (strict field validation) is; accepting every example; equal, regenerated, to the
vendored file; and small enough for etcd.

The API server's own verdict (the CRD accepted, `resorces` refused, `kubectl explain` answering) is in
tests/integration/test_template_refusals.py.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from elasticjob import crd, integrations, podschema
from elasticjob.convert import convert_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BUILD_SH = ROOT / "localcluster" / "build.sh"
# What a CRD's JSONSchemaProps may hold of what the template uses; anything else (x-kubernetes-patch-strategy,
# $ref, allOf) the API server refuses, or drops as an unknown field.
CRD_KEYS = {"description", "type", "format", "required", "properties", "items", "additionalProperties", "default",
            "minItems", "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
            "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}
# etcd's default request limit (--max-request-bytes), which bounds a stored object.
ETCD_LIMIT = int(1.5 * 1024 * 1024)


def crd_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.crd(integrations.status_parts())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def template_schema() -> dict[str, Any]:
    template: dict[str, Any] = crd_schema()["properties"]["spec"]["properties"]["template"]
    return template


def nodes(schema: dict[str, Any], path: str = "template") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node under schema, by its path (array items as `[]`, map values as `{}`)."""
    yield path, schema
    for name, prop in (schema.get("properties") or {}).items():
        yield from nodes(prop, f"{path}.{name}")
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(schema.get(key), dict):
            yield from nodes(schema[key], f"{path}{mark}")


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the API server applies it with strict field validation, for a JSON Schema validator: unknown
    fields refused where an object lists its fields and keeps no others; int-or-string as its two types."""
    out = copy.deepcopy(schema)
    for _, node in nodes(out):
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        if node.get("x-kubernetes-int-or-string"):
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def errors(schema: dict[str, Any], instance: Any) -> list[str]:
    validator = jsonschema.Draft7Validator(strict(schema))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


# --- structural, as the API server requires of a CRD -----------------------------------------------------------


def test_every_node_has_a_type_and_no_reference() -> None:
    untyped = [path for path, node in nodes(template_schema())
               if "type" not in node and not node.get("x-kubernetes-int-or-string")]
    foreign = {path: sorted(set(node) - CRD_KEYS) for path, node in nodes(template_schema()) if set(node) - CRD_KEYS}
    assert not untyped, f"nodes without a type: {untyped}"
    assert not foreign, f"keys a CRD schema cannot hold: {foreign}"
    assert "$ref" not in json.dumps(template_schema())


def test_the_keys_of_a_map_list_are_required_or_defaulted() -> None:
    """The API server refuses the CRD otherwise ("must have a default or be a required property")."""
    missing = [f"{path}[].{key}" for path, node in nodes(template_schema())
               if node.get("x-kubernetes-list-type") == "map"
               for key in node["x-kubernetes-list-map-keys"]
               if key not in node["items"].get("required", []) and "default" not in node["items"]["properties"][key]]
    assert not missing


def test_defaults_are_only_those_of_map_list_keys() -> None:
    """Any other would be written into stored jobs, changing the hash of their templates (Kueue requeues a job
    whose template changed); the API server defaults the pods themselves."""
    keyed = {f"{path}[].{key}" for path, node in nodes(template_schema())
             if node.get("x-kubernetes-list-type") == "map" for key in node["x-kubernetes-list-map-keys"]}
    defaulted = {path for path, node in nodes(template_schema()) if "default" in node}
    assert defaulted and defaulted <= keyed, defaulted - keyed


@pytest.mark.parametrize("path, marks", [
    ("template.spec.containers", {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}),
    ("template.spec.containers[].env", {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}),
    ("template.spec.containers[].ports",
     {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["containerPort", "protocol"]}),
    ("template.spec.containers[].resources.limits{}", {"x-kubernetes-int-or-string": True}),
    ("template.spec.containers[].livenessProbe.httpGet.port", {"x-kubernetes-int-or-string": True}),
    ("template.spec.nodeSelector", {"type": "object", "x-kubernetes-map-type": "atomic"}),
])
def test_upstream_markers_are_kept(path: str, marks: dict[str, Any]) -> None:
    node = dict(nodes(template_schema()))[path]
    assert {key: node.get(key) for key in marks} == marks


def test_embedded_metadata_says_only_what_a_template_may() -> None:
    metadata = dict(nodes(template_schema()))["template.metadata"]
    assert set(metadata["properties"]) == {"name", "namespace", "labels", "annotations", "finalizers", "creationTimestamp"}


# --- strict about what a user writes ---------------------------------------------------------------------------


WORKER = {"name": "worker", "image": "trainer:1", "command": ["torchrun", "train.py"],
          "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1}}}


def with_change(change: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"labels": {"team": "a"}}, "spec": {"containers": [dict(WORKER)]}}
    template["spec"]["containers"][0].update(change.get("container", {}))
    template["spec"].update(change.get("spec", {}))
    template.update(change.get("template", {}))
    return template


@pytest.mark.parametrize("change, refusal", [
    ({}, None),
    ({"container": {"ports": [{"containerPort": 29500}], "env": [{"name": "A", "value": "1"}]}}, None),
    ({"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}], "terminationGracePeriodSeconds": 5}}, None),
    ({"container": {"resorces": {"limits": {"cpu": "1"}}}}, "'resorces' was unexpected"),
    ({"template": {"metadata": {"lables": {"team": "a"}}}}, "'lables' was unexpected"),
    ({"spec": {"nodeSelektor": {"gpu": "a100"}}}, "'nodeSelektor' was unexpected"),
    ({"container": {"ports": "29500"}}, "is not of type 'array'"),
    ({"container": {"resources": {"limits": {"cpu": [1]}}}}, "is not valid under any of the given schemas"),
    ({"spec": {"containers": []}}, "should be non-empty"),
    ({"spec": {"containers": [{"image": "trainer:1"}]}}, "'name' is a required property"),
    ({"template": {"spec": {}}}, "'containers' is a required property"),
])
def test_a_template_is_checked_field_by_field(change: dict[str, Any], refusal: str | None) -> None:
    found = errors(template_schema(), with_change(change))
    assert (found == []) if refusal is None else any(refusal in error for error in found), found


def test_a_template_needs_a_spec() -> None:
    assert any("'spec' is a required property" in error for error in errors(template_schema(), {"metadata": {}}))


def example_jobs() -> list[tuple[str, dict[str, Any]]]:
    """Every ElasticJob under examples/, and those `elasticjob convert` makes of the PyTorchJob examples."""
    found = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        name = str(path.relative_to(EXAMPLES))
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        if any(doc.get("kind") == "PyTorchJob" for doc in docs):
            docs, name = convert_text(path.read_text()).documents, f"{name} (converted)"
        found += [(name, doc) for doc in docs if doc.get("kind") == "ElasticJob"]
    return found


@pytest.mark.parametrize("name, job", example_jobs(), ids=[name for name, _ in example_jobs()])
def test_every_example_is_valid_against_the_whole_crd(name: str, job: dict[str, Any]) -> None:
    assert errors(crd_schema(), job) == []


# --- the vendored file ---------------------------------------------------------------------------------------


def newest_supported() -> str:
    """The newest release in localcluster/build.sh's table of supported minors: a field any of them serves is
    known to the schema (an older cluster refuses it when the pod is created, in words the job then shows)."""
    found = re.findall(r"\[1\.\d+\]=(v[\d.]+)", BUILD_SH.read_text())
    assert found, f"no supported releases in {BUILD_SH}"
    return max(found, key=lambda v: tuple(int(part) for part in v[1:].split(".")))


def test_the_vendored_schema_is_of_the_newest_supported_release() -> None:
    assert podschema.vendored()["source"] == f"k8s.io/kubernetes@{newest_supported()}/{podschema.SOURCE_PATH}", \
        "regenerate it: make pod-schema"


def test_the_api_doc_names_that_release() -> None:
    assert f"the newest\nsupported release ({newest_supported().removeprefix('v')})" in (ROOT / "docs" / "api.md").read_text()


def test_the_vendored_schema_is_what_the_generator_makes_of_upstream() -> None:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain: the module cache holding Kubernetes' OpenAPI is not here")
    cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=60).stdout.strip()
    module = Path(cache) / "k8s.io" / f"kubernetes@{newest_supported()}"
    if not (module / podschema.SOURCE_PATH).exists():
        pytest.skip(f"{module} is not in the Go module cache (make pod-schema downloads it)")
    vendored = (ROOT / "operator" / "elasticjob" / "pod_template_schema.json").read_text()
    assert podschema.resolved_json(module) == vendored, "regenerate it: make pod-schema"


def test_the_crd_leaves_room_in_etcd() -> None:
    """The stored CRD holds its schema and, from a server-side apply, managedFields naming each of its fields
    again (less than the schema itself): twice the schema must fit etcd's limit. (A client-side `kubectl apply`
    would also copy it into an annotation limited to 256 KiB, which it does not fit: docs/api.md says so.)"""
    size = len(json.dumps(crd.crd(integrations.status_parts()), separators=(",", ":")))
    assert 2 * size < ETCD_LIMIT, f"the CRD is {size} bytes"


# --- the generator, on small documents -------------------------------------------------------------------------


INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


def document(schemas: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 document whose PodTemplateSpec has the field `f` as given; other schemas by name (core/v1's
    short, others in full)."""
    named = {name if "." in name else f"io.k8s.api.core.v1.{name}": schema
             for name, schema in schemas.items() if name != "f"}
    root = {"type": "object", "properties": {"f": schemas["f"]}}
    return {"components": {"schemas": {podschema.ROOT: root, **named}}}


def ref(name: str) -> dict[str, Any]:
    return {"allOf": [{"$ref": f"#/components/schemas/io.k8s.api.core.v1.{name}"}], "default": {}}


@pytest.mark.parametrize("schemas, field", [
    # A reference is inlined; the field's own words win over its type's, and `default: {}` goes.
    ({"f": {**ref("T"), "description": "field"}, "T": {"type": "object", "description": "type",
                                                       "properties": {"a": {"type": "string"}}}},
     {"type": "object", "description": "field", "properties": {"a": {"type": "string"}}}),
    ({"f": ref("T"), "T": {"type": "string", "description": "type"}}, {"type": "string", "description": "type"}),
    # Free-form (RawExtension) keeps what is written; a map of strings is typed as it is.
    ({"f": {"type": "object"}}, {"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
    ({"f": {"type": "object", "additionalProperties": {"type": "string", "default": ""}}},
     {"type": "object", "additionalProperties": {"type": "string"}}),
    # IntOrString and Quantity, untyped upstream (oneOf), are int-or-string.
    ({"f": {"$ref": f"#/components/schemas/{INT_OR_STRING}", "description": "port"},
      INT_OR_STRING: {"oneOf": [{"type": "integer"}, {"type": "string"}], "format": "int-or-string"}},
     {"description": "port", "x-kubernetes-int-or-string": True}),
    # Patch strategies and unknown formats go; list markers and known formats stay; defaults go but a map key's.
    ({"f": {"type": "array", "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": "port",
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "protocol"],
            "items": ref("P")},
      "P": {"type": "object", "required": ["port"], "properties": {
          "port": {"type": "integer", "format": "int32", "default": 0},
          "protocol": {"type": "string", "default": "TCP"}, "name": {"type": "string", "default": ""}}}},
     {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "protocol"],
      "items": {"type": "object", "required": ["port"], "properties": {
          "port": {"type": "integer", "format": "int32"}, "protocol": {"type": "string", "default": "TCP"},
          "name": {"type": "string"}}}}),
])
def test_the_generator_makes_upstream_structural(schemas: dict[str, Any], field: dict[str, Any]) -> None:
    assert podschema.resolve(document(schemas))["properties"]["f"] == field


@pytest.mark.parametrize("schemas, refusal", [
    ({"f": ref("T"), "T": {"type": "object", "properties": {"child": ref("T")}}}, "cannot recurse"),
    ({"f": {"description": "no type"}}, "no type"),
    ({"f": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
            "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}, "neither required nor"),
])
def test_the_generator_refuses_what_a_crd_cannot_say(schemas: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        podschema.resolve(document(schemas))
