"""`elasticjob convert`: Kubeflow PyTorchJobs (kubeflow.org/v1) as ElasticJobs. Pure: YAML text in, YAML text and
warnings out (cli.py reads the file and prints). See docs/migrating.md.

Input that is no PyTorchJob as its API defines it (not YAML, too large, YAML aliases, a field of the wrong type)
raises InputError; a job understood but not convertible, ConversionError. Both say what to change."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from elasticjob.convert import pytorchjob, safeyaml, shape
from elasticjob.convert.errors import ConversionError, InputError

__all__ = ["ConversionError", "Converted", "InputError", "convert_documents", "convert_text"]

KUBEFLOW_GROUP = "kubeflow.org/"
LIST_KIND = "List"


@dataclass(frozen=True)
class Converted:
    documents: list[dict[str, Any]]
    warnings: list[str]

    def yaml(self) -> str:
        return safeyaml.dump_all(self.documents)


def convert_text(text: str) -> Converted:
    return convert_documents(safeyaml.load_all(text))


def convert_documents(documents: list[Any]) -> Converted:
    """Each PyTorchJob converted; any other object (a ConfigMap the job mounts, say) passed through unchanged. The
    items of a List (what `kubectl get -o yaml` prints for many objects) come out as documents of their own."""
    out: list[dict[str, Any]] = []
    warnings: list[str] = []
    for where, document in _objects(documents):
        _checked(document, shape.OBJECT, where)
        kind, api = document.get("kind"), str(document.get("apiVersion", ""))
        name = (document.get("metadata") or {}).get("name") or f"({where})"
        if kind == "PyTorchJob" and api.startswith(KUBEFLOW_GROUP):
            _checked(document, shape.PYTORCHJOB, f"PyTorchJob {name}")
            converted, notes = _converted(document, name)
            out += converted
            warnings += [f"PyTorchJob {name}: {note}" for note in notes]
        elif api.startswith(KUBEFLOW_GROUP):
            raise ConversionError(f"{kind} {name}: only PyTorchJobs convert to ElasticJobs")
        else:
            out.append(document)
            warnings.append(f"{kind} {name}: not a PyTorchJob, passed through unchanged")
    if not any(d.get("kind") == "ElasticJob" for d in out):
        empty = any(isinstance(d, dict) and _is_list(d) and not d.get("items") for d in documents)
        raise ConversionError("no PyTorchJob found" + (" (the input holds an empty List)" if empty else ""))
    return Converted(out, warnings)


def _objects(documents: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each object, with where it is for messages: the documents, and the items of each List in their place."""
    for index, document in enumerate(documents):
        if document is not None:
            yield from _flattened(document, f"document {index + 1}")


def _flattened(document: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(document, dict):
        raise InputError(f"{where} is not a Kubernetes object")
    if not _is_list(document):
        yield where, document
        return
    _checked(document, shape.LIST_OBJECT, where)
    kind = str(document["kind"])
    for index, item in enumerate(document.get("items") or []):
        if kind != LIST_KIND:  # a typed list (the API's PyTorchJobList) leaves its items' kind out
            item = {"apiVersion": document.get("apiVersion"), "kind": kind.removesuffix(LIST_KIND), **item}
        yield from _flattened(item, f"{where} items[{index}]")


def _is_list(document: dict[str, Any]) -> bool:
    kind = document.get("kind")
    return kind == LIST_KIND or isinstance(kind, str) and kind.endswith(LIST_KIND) and "items" in document


def _checked(document: dict[str, Any], fields: list[tuple[tuple[str, ...], shape.Expect]], what: str) -> None:
    try:
        shape.check(document, fields)
    except InputError as error:
        raise InputError(f"{what}: {error}") from None


def _converted(document: dict[str, Any], name: str) -> tuple[list[dict[str, Any]], list[str]]:
    try:
        return pytorchjob.convert(document)
    except ConversionError as error:
        raise ConversionError(f"PyTorchJob {name}: {error}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
        # shape.py checks every field read; this is what it missed, still said without a traceback.
        raise InputError(f"PyTorchJob {name}: a field is not of the type its API defines "
                         f"({type(error).__name__}: {error}); check it against the PyTorchJob API") from None
