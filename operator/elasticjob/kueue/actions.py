"""Kueue's own writes, as the planner plans them (kueue/admission.py, kueue/slices.py) and kueue/io.py applies
them: the controller hands them back through the integration's registry (elasticjob/integrations.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticjob.planner.base import Event, IntegrationAction


@dataclass(frozen=True)
class PatchWorkload(IntegrationAction):
    """A pending Kueue Workload's pod sets, made to match the spec again (immutable once it holds quota)."""

    name: str
    resource_version: str
    pod_sets: list[dict[str, Any]]
    queue_name: str
    event: Event | None = None


@dataclass(frozen=True)
class ApplyWorkloadStatus(IntegrationAction):
    """Server-side apply of a Workload's status as Kueue's job integrations do it (field manager
    kueue-admission, forced, at the resourceVersion it was planned from): release the quota, or mark it
    Finished."""

    name: str
    body: dict[str, Any]
    event: Event | None = None
