"""`elasticjob convert`: Kubeflow PyTorchJobs (kubeflow.org/v1) as ElasticJobs. Pure: YAML text in, YAML text and
warnings out (cli.py reads the file and prints). See docs/migrating.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from elasticjob.convert import pytorchjob
from elasticjob.convert.errors import ConversionError

__all__ = ["ConversionError", "Converted", "convert_documents", "convert_text"]

KUBEFLOW_GROUP = "kubeflow.org/"


@dataclass(frozen=True)
class Converted:
    documents: list[dict[str, Any]]
    warnings: list[str]

    def yaml(self) -> str:
        return str(yaml.safe_dump_all(self.documents, sort_keys=False, default_flow_style=False))


def convert_text(text: str) -> Converted:
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise ConversionError(f"not YAML: {error}") from None
    return convert_documents(documents)


def convert_documents(documents: list[Any]) -> Converted:
    """Each PyTorchJob converted; any other object (a ConfigMap the job mounts, say) passed through unchanged."""
    out: list[dict[str, Any]] = []
    warnings: list[str] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ConversionError(f"document {index + 1} is not a Kubernetes object")
        kind, api = document.get("kind"), str(document.get("apiVersion", ""))
        name = (document.get("metadata") or {}).get("name") or f"(document {index + 1})"
        if kind == "PyTorchJob" and api.startswith(KUBEFLOW_GROUP):
            try:
                converted, notes = pytorchjob.convert(document)
            except ConversionError as error:
                raise ConversionError(f"PyTorchJob {name}: {error}") from None
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
