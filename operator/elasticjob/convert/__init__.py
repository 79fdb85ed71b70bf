"""`elasticjob convert`: Kubeflow PyTorchJobs (kubeflow.org/v1) as ElasticJobs. Pure: YAML text in, YAML text and
warnings out (cli.py reads the file and prints). See docs/migrating.md.

Input that is no PyTorchJob as its API defines it (not YAML, too large, YAML aliases, a field of the wrong type)
raises InputError; a job understood but not convertible, ConversionError. Both say what to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticjob.convert import pytorchjob, safeyaml, shape
from elasticjob.convert.errors import ConversionError, InputError

__all__ = ["ConversionError", "Converted", "InputError", "convert_documents", "convert_text"]

KUBEFLOW_GROUP = "kubeflow.org/"


@dataclass(frozen=True)
class Converted:
    documents: list[dict[str, Any]]
    warnings: list[str]

    def yaml(self) -> str:
        return safeyaml.dump_all(self.documents)


def convert_text(text: str) -> Converted:
    return convert_documents(safeyaml.load_all(text))


def convert_documents(documents: list[Any]) -> Converted:
    """Each PyTorchJob converted; any other object (a ConfigMap the job mounts, say) passed through unchanged."""
    out: list[dict[str, Any]] = []
    warnings: list[str] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise InputError(f"document {index + 1} is not a Kubernetes object")
        _checked(document, shape.OBJECT, f"document {index + 1}")
        kind, api = document.get("kind"), str(document.get("apiVersion", ""))
        name = (document.get("metadata") or {}).get("name") or f"(document {index + 1})"
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
        raise ConversionError("no PyTorchJob found")
    return Converted(out, warnings)


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
