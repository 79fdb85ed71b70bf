"""The Kubernetes PodTemplateSpec as a structural schema, for the CRD's spec.template.

`resolve` turns the official OpenAPI v3 document of the core API (api__v1_openapi.json in k8s.io/kubernetes, the
release the local cluster builds) into what the API server accepts in a CRD: $refs inlined, a type on every node,
IntOrString and Quantity as x-kubernetes-int-or-string, free-form objects marked to keep their fields, upstream's
list-type and map-key markers kept, patch strategies and unions dropped. `make pod-schema` writes the result to
pod_template_schema.json beside this file (`python -m elasticjob.podschema MODULE_DIR`, the module k8s.io/kubernetes
unpacked in the Go module cache); `elasticjob crd` reads only that file (no Go module cache at runtime), and a unit
test regenerates it when the cache is there.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

SOURCE_PATH = "api/openapi-spec/v3/api__v1_openapi.json"
ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
_PREFIX = "#/components/schemas/"
_INT_OR_STRING = {"io.k8s.apimachinery.pkg.util.intstr.IntOrString", "io.k8s.apimachinery.pkg.api.resource.Quantity"}
# What an embedded ObjectMeta (the template's, an ephemeral volume's claim template's) may say, as controller-gen's
# crd:generateEmbeddedObjectMeta keeps it: the rest (uid, managedFields, ownerReferences, ...) is the API server's
# to set on the objects it creates. Beside them creationTimestamp, which Go clients (kubectl create --dry-run -o
# yaml, for one) write as null into every template they print: strict field validation (kubectl's default) would
# refuse it as unknown, where a known field's null is dropped.
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_EMBEDDED_META = ("name", "namespace", "labels", "annotations", "finalizers", "creationTimestamp")
# The keys a CRD schema (JSONSchemaProps) has and upstream uses; the others (x-kubernetes-patch-*, -unions,
# -group-version-kind) the API server refuses or ignores in a CRD.
_KEPT = {"description", "type", "format", "enum", "required", "properties", "items", "additionalProperties",
         "minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "pattern",
         "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"}
# The formats the API server knows; upstream's others (int-or-string on IntOrString) say nothing to it.
_FORMATS = {"int32", "int64", "float", "double", "byte", "date", "date-time", "password"}


def resolve(document: dict[str, Any]) -> dict[str, Any]:
    """The structural schema of a PodTemplateSpec from the core API's OpenAPI v3 document."""
    schemas = document["components"]["schemas"]
    return _inline(schemas[ROOT], schemas, (ROOT,))


def _inline(node: dict[str, Any], schemas: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """One node, its $refs (bare or as upstream's `allOf: [{$ref}]`) replaced by their targets."""
    ref = _ref_of(node)
    if ref is not None:
        if ref in path:
            raise ValueError(f"{ref} contains itself ({' -> '.join(path)}): a CRD schema cannot recurse")
        if ref in _INT_OR_STRING:
            return {**_description(schemas[ref], node), "x-kubernetes-int-or-string": True}
        target = _inline(schemas[ref], schemas, (*path, ref))
        if ref == _OBJECT_META:
            target["properties"] = {name: target["properties"][name] for name in _EMBEDDED_META}
        return {**target, **_description(target, node)}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEPT or (key == "format" and value not in _FORMATS):
            continue
        if key == "properties":
            out[key] = {name: _inline(prop, schemas, path) for name, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _inline(value, schemas, path)
        else:
            out[key] = value
    if out.get("x-kubernetes-list-type") == "map":
        _keep_map_key_defaults(node, out, schemas)
    return _typed(out)


def _ref_of(node: dict[str, Any]) -> str | None:
    if "$ref" in node:
        return str(node["$ref"]).removeprefix(_PREFIX)
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        return str(all_of[0]["$ref"]).removeprefix(_PREFIX)
    return None


def _description(target: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The field's own description, else its type's (a field says what it is for, its type what it is)."""
    text = node.get("description") or target.get("description")
    return {"description": text} if text else {}


def _typed(out: dict[str, Any]) -> dict[str, Any]:
    """A type on every node: an object with neither properties nor typed values is free-form (RawExtension),
    its fields kept as written."""
    if "type" not in out and "x-kubernetes-int-or-string" not in out:
        raise ValueError(f"no type in upstream schema: {str(out.get('description'))[:80]!r}...")
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _keep_map_key_defaults(node: dict[str, Any], out: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Upstream defaults are dropped (a CRD default is written into every stored job, and into the hash of its
    template; the API server defaults the pods itself), but for the keys of a map list that are not required:
    the API server refuses such a key without one (ports' protocol TCP, imagePullSecrets' name)."""
    ref = _ref_of(node["items"])
    upstream = schemas[ref]["properties"] if ref else node["items"].get("properties", {})
    item = out["items"]
    for key in out["x-kubernetes-list-map-keys"]:
        if key in item.get("required", []):
            continue
        if "default" not in upstream[key]:
            raise ValueError(f"map-list key {key} of {ref or 'an inline item'} is neither required nor defaulted")
        item["properties"][key]["default"] = upstream[key]["default"]


def resolved_json(module_dir: Path) -> str:
    """The vendored file from the module k8s.io/kubernetes@VERSION: where it came from, and the schema."""
    document = json.loads((module_dir / SOURCE_PATH).read_text())
    source = f"k8s.io/{module_dir.name}/{SOURCE_PATH}"
    return json.dumps({"source": source, "schema": resolve(document)}, indent=1, sort_keys=True) + "\n"


def vendored() -> dict[str, Any]:
    """The vendored file as written by `make pod-schema`: {"source": ..., "schema": ...}."""
    text = resources.files("elasticjob").joinpath("pod_template_schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def template_schema() -> dict[str, Any]:
    """The vendored structural PodTemplateSpec schema."""
    schema: dict[str, Any] = vendored()["schema"]
    return schema


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m elasticjob.podschema MODULE_DIR (k8s.io/kubernetes@VERSION in the Go module cache)",
              file=sys.stderr)
        return 2
    sys.stdout.write(resolved_json(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
