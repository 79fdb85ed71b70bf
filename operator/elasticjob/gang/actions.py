"""The gang's own write, as gang/planning.py plans it and gang/io.py applies it: the controller hands it back
through the integration's registry (elasticjob/integrations.py). Creating and deleting the PodGroup are the
controller's generic object actions, as Kueue's Workloads are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticjob.planner.base import Event, IntegrationAction


@dataclass(frozen=True)
class PatchPodGroup(IntegrationAction):
    """A merge patch of the job's Coscheduling PodGroup (its minMember and timeout follow the spec in place)."""

    api_version: str
    name: str
    patch: dict[str, Any]
    event: Event | None = None
