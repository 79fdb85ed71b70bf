"""What every model of the ElasticJob API shares: the API's names, its limits, and camelCase on the wire."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

GROUP = "elasticjob.dev"
VERSION = "v1alpha1"
KIND = "ElasticJob"
PLURAL = "elasticjobs"
SINGULAR = "elasticjob"
SHORT_NAMES = ["ej"]
API_VERSION = f"{GROUP}/{VERSION}"

# The most nodes one job may ask for; it also bounds the cost of the CEL rules.
MAX_NODES = 1024
MAX_SPARES = 64
MAX_FAILURES_KEPT = 10
MAX_INCIDENTS_KEPT = 5


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
