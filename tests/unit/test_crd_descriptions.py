"""`kubectl explain` is a user's manual for the CRDs: every property says what it is, in words meant for users."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticjob import crd, integrations, podschema

ROOT = Path(__file__).resolve().parents[2]
# What only the project's own people could follow: source files, notes, issue numbers.
INTERNAL = re.compile(r"[\w/.-]+\.py\b|shared notes|\bissues? ", re.IGNORECASE)
# The API server refuses a CRD whose root `metadata` says more than its type: kubectl explains ObjectMeta itself.
UNDESCRIBABLE = {"metadata"}


def _crds() -> list[dict[str, Any]]:
    return [crd.crd(integrations.status_parts())]


def _schema(definition: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def properties(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property under node, by its path as `kubectl explain` spells it (arrays' items as `[]`)."""
    for name, prop in (node.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        yield where, prop
        yield from properties(prop, where)
    if isinstance(node.get("items"), dict):
        yield from properties(node["items"], f"{path}[]")


def descriptions(node: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The root's description and every property's and array item's, by path."""
    yield "(root)", node.get("description", "")
    for path, prop in properties(node):
        yield path, prop.get("description", "")
        if isinstance(prop.get("items"), dict) and "description" in prop["items"]:
            yield f"{path}[]", prop["items"]["description"]


@functools.cache
def kubernetes_own() -> frozenset[str]:
    """The words of Kubernetes' own API on a pod template (spec.template, vendored from its OpenAPI): not ours to
    word, and they follow Kubernetes' conventions ("Defaults to ...", "issues")."""
    return frozenset(text for _, text in descriptions(podschema.template_schema()))


@pytest.mark.parametrize("definition", _crds(), ids=lambda d: d["metadata"]["name"])
def test_every_property_is_described(definition: dict[str, Any]) -> None:
    missing = [path for path, prop in properties(_schema(definition))
               if not prop.get("description", "").strip() and path not in UNDESCRIBABLE]
    assert not missing, f"{definition['metadata']['name']}: properties without a description: {missing}"


def test_the_root_metadata_is_left_as_the_api_server_requires() -> None:
    """It refuses the whole CRD otherwise ("must not specify anything other than name and generateName")."""
    for definition in _crds():
        assert set(_schema(definition)["properties"].get("metadata", {"type": "object"})) == {"type"}


@pytest.mark.parametrize("definition", _crds(), ids=lambda d: d["metadata"]["name"])
def test_descriptions_name_no_internal_material(definition: dict[str, Any]) -> None:
    internal = {path: hit.group(0) for path, text in descriptions(_schema(definition))
                if (hit := INTERNAL.search(text)) and text not in kubernetes_own()}
    assert not internal, f"{definition['metadata']['name']}: descriptions that point at internal material: {internal}"


def _wire(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_spec_descriptions_name_their_defaults() -> None:
    """A user reads the default in the description; one that names another value misleads."""
    spec = _schema(crd.crd(integrations.status_parts()))["properties"]["spec"]
    wrong = {path: prop["default"] for path, prop in properties(spec)
             if isinstance(prop.get("default"), (bool, int, str)) and prop["description"] not in kubernetes_own()
             and not re.search(rf"\bDefault {re.escape(_wire(prop['default']))}\b", prop["description"])}
    assert not wrong, f"spec properties whose description does not name their default: {wrong}"


@pytest.mark.parametrize(("text", "internal"), [
    ("the next number (see planner/ownership.py)", True),
    ("Defaults come from measurements (shared notes)", True),
    ("added for issue 36", True),
    ("Deadline passed to torch.distributed.elastic.timer.expires", False),
    ("Run torchrun through elasticjob_warm", False),
    ("Issued by the operator", False),
])
def test_internal_material_is_recognised(text: str, internal: bool) -> None:
    assert bool(INTERNAL.search(text)) is internal
