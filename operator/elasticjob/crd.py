"""Generates the ElasticJob CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema (with $refs, anyOf-null and titles); Kubernetes wants a structural OpenAPI v3 schema
(inlined, no nulls, x-kubernetes-* markers). The CEL rules live here, next to the schema they guard. spec.template
is Kubernetes' own PodTemplateSpec, resolved from its OpenAPI and vendored (podschema.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel

from elasticjob import podschema
from elasticjob.models import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_FAILURES_KEPT,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ElasticJobSpec,
    ElasticJobStatus,
    StatusPart,
)

CRD_NAME = f"{PLURAL}.{GROUP}"

SPEC_RULES = [
    {"rule": "self.minReplicas <= self.maxReplicas",
     "message": "minReplicas must be less than or equal to maxReplicas"},
    {"rule": "!has(self.replicas) || (self.replicas >= self.minReplicas && self.replicas <= self.maxReplicas)",
     "message": "replicas must be between minReplicas and maxReplicas"},
    {"rule": "!has(self.spares) || self.spares == 0 || !has(self.warmStarts) || self.warmStarts",
     "message": "spares need warmStarts: true (a spare's agent waits for its seat through the kit)"},
]
NPROC_RULES = [
    {"rule": "type(self) == int ? int(self) >= 1 : string(self) == 'auto'",
     "message": "nprocPerNode must be a positive integer or 'auto'"},
]
EXIT_CODE_RULES = [
    {"rule": "self.all(c, c >= 1 && c <= 255)", "message": "fatalExitCodes must be between 1 and 255"},
]
# What the operator says of the template's parts, over upstream's words for a pod's.
TEMPLATE_DESCRIPTIONS = {
    "metadata": "Labels and annotations of every worker pod; the operator adds its own labels "
                "elasticjob.dev/job-name, elasticjob.dev/role and elasticjob.dev/replica-index.",
    "spec": "The worker pod's spec. The operator sets restartPolicy Never, gives the torchrun container its "
            "settings as environment (PET_*) and, with warm starts, the init container and volume elasticjob-kit; "
            "the API server validates the pods when the operator creates them.",
    "containers": "The worker pod's containers (at least one); the one named worker, else the first, runs "
                  "torchrun.",
    "name": "The container's name; worker marks the one that runs torchrun.",
}


def template_schema(description: str) -> dict[str, Any]:
    """Kubernetes' PodTemplateSpec (podschema.py: upstream's OpenAPI, vendored), with the operator's words on the
    parts it acts on; a template must have a spec with at least one container."""
    template = podschema.template_schema()
    template["description"] = description
    template["required"] = ["spec"]
    props = template["properties"]
    props["metadata"]["description"] = TEMPLATE_DESCRIPTIONS["metadata"]
    props["spec"]["description"] = TEMPLATE_DESCRIPTIONS["spec"]
    containers = props["spec"]["properties"]["containers"]
    containers["description"] = TEMPLATE_DESCRIPTIONS["containers"]
    containers["minItems"] = 1
    containers["items"]["properties"]["name"]["description"] = TEMPLATE_DESCRIPTIONS["name"]
    return template


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready workers"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Spares", "type": "integer", "jsonPath": ".status.spares",
     "description": "Warm spare pods waiting, ready, for a seat in the job's rounds (spec.spares)"},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Goodput", "type": "number", "jsonPath": ".status.goodput.goodputPercent",
     "description": "Percent of wall time spent training (ETTR), as of the ledger's last account"},
    {"name": "Weighted", "type": "number", "jsonPath": ".status.goodput.weightedGoodputPercent", "priority": 1,
     "description": "ETTR with each second weighted by the nodes that trained over the nodes wanted"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Rendezvous", "type": "string", "jsonPath": ".status.rendezvous.endpoint", "priority": 1},
    {"name": "Round", "type": "integer", "jsonPath": ".status.rendezvous.round", "priority": 1,
     "description": "How often the worker group has (re)formed"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP_KEYS = {"title", "$defs"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and turn pydantic's JSON Schema idioms into structural OpenAPI."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        extra = {k: _resolve(v, defs) for k, v in node.items() if k != "$ref" and k not in _DROP_KEYS}
        return {**target, **extra}
    if "anyOf" in node:
        return _collapse_any_of(node, defs)
    out = {k: _resolve(v, defs) for k, v in node.items() if k not in _DROP_KEYS}
    if isinstance(out.get("description"), str):
        out["description"] = " ".join(out["description"].split())
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if out.get("type") == "object" and "properties" not in out:
        if isinstance(out.get("additionalProperties"), dict) and out["additionalProperties"].get("type"):
            return out  # a map of typed values (dict[str, str]): structural as it is
        out.pop("additionalProperties", None)
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _collapse_any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    options = [opt for opt in node["anyOf"] if opt.get("type") != "null"]
    rest = {k: _resolve(v, defs) for k, v in node.items() if k != "anyOf" and k not in _DROP_KEYS}
    if rest.get("default", 0) is None:
        rest.pop("default")
    if len(options) == 1:
        return {**_resolve(options[0], defs), **rest}
    types = {opt.get("type") for opt in options}
    if types == {"integer", "string"}:
        return {**rest, "x-kubernetes-int-or-string": True}
    raise ValueError(f"cannot express {node} as a structural schema")


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    resolved: dict[str, Any] = _resolve(raw, raw.get("$defs", {}))
    return resolved


def _default_nested_objects(schema: dict[str, Any]) -> None:
    """Give optional sub-objects `default: {}` so the API server fills in their fields' defaults too."""
    for name, prop in schema["properties"].items():
        if prop.get("type") == "object" and "properties" in prop and name not in schema.get("required", []):
            prop.setdefault("default", {})
            _default_nested_objects(prop)


def spec_schema() -> dict[str, Any]:
    schema = _schema_of(ElasticJobSpec)
    _default_nested_objects(schema)
    props = schema["properties"]
    props["nprocPerNode"]["x-kubernetes-validations"] = NPROC_RULES
    props["failurePolicy"]["properties"]["fatalExitCodes"]["x-kubernetes-validations"] = EXIT_CODE_RULES
    props["template"] = template_schema(props["template"]["description"])
    schema["x-kubernetes-validations"] = SPEC_RULES
    return schema


def status_schema(parts: Sequence[StatusPart] = ()) -> dict[str, Any]:
    """The core's status, and each integration's part under its key (the core allows keys of its own: the CRD
    names exactly these, and the API server prunes any other)."""
    schema = _schema_of(ElasticJobStatus)
    schema.pop("additionalProperties", None)
    props = schema["properties"]
    props["lastFailures"]["maxItems"] = MAX_FAILURES_KEPT
    props["conditions"]["x-kubernetes-list-type"] = "map"
    props["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    for part in parts:
        props[part.key] = {**_schema_of(part.model), "description": part.description}
    return schema


def printer_columns(parts: Sequence[StatusPart] = ()) -> list[dict[str, Any]]:
    """PRINTER_COLUMNS with each part's columns, each after the one it names."""
    columns = list(PRINTER_COLUMNS)
    for part in parts:
        for after, column in part.columns:
            at = next(i for i, c in enumerate(columns) if c["name"] == after)
            columns.insert(at + 1, column)
    return columns


def crd(parts: Sequence[StatusPart] = ()) -> dict[str, Any]:
    """The CRD, with the integrations' parts of the status (integrations.status_parts()) where given."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "plural": PLURAL, "singular": SINGULAR, "shortNames": SHORT_NAMES,
                      "listKind": f"{KIND}List", "categories": ["all"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "An elastic PyTorch training job run by torchrun agents.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string", "description": f"The API version: {API_VERSION}."},
                        "kind": {"type": "string", "description": f"The kind: {KIND}."},
                        # The API server refuses anything here but the type: it describes ObjectMeta itself.
                        "metadata": {"type": "object"},
                        "spec": spec_schema(),
                        "status": status_schema(parts),
                    },
                }},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                              "labelSelectorPath": ".status.selector"},
                },
                "additionalPrinterColumns": printer_columns(parts),
            }],
        },
    }


def crd_yaml(parts: Sequence[StatusPart] = ()) -> str:
    header = "# Generated from operator/elasticjob/models/ by `elasticjob crd` (make crds). Do not edit.\n"
    return header + str(yaml.safe_dump(crd(parts), sort_keys=False, width=120))
