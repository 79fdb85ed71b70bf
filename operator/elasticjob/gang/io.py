"""A job's PodGroup, for the controller: read without a watch, and remembered between reconciles.

The group is read (GET) the first time a job's loop needs it, again after the operator created or deleted it,
and every few minutes; in between the loop's memory says what is there. Creating and deleting it are the
controller's generic object actions (controller/apply.py); patching it is the gang's own (gang/actions.py,
applied here). GangIO is the integration as the controller runs it (elasticjob/integrations.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from elasticjob import k8s, planner
from elasticjob.domain import JobRef, Settings
from elasticjob.gang import podgroup
from elasticjob.gang.actions import PatchPodGroup
from elasticjob.gang.planning import Gang
from elasticjob.gang.podgroup import PodGroupView

# A PodGroup the operator knows is read again after this long (someone may have deleted it).
RECHECK_SECONDS = 300.0


@dataclass
class Memory:
    # The job's PodGroup per API, as last read or left by the operator, and when.
    groups: dict[str, tuple[PodGroupView | None, float]] = field(default_factory=dict)


class GangIO:
    """The integration as the controller runs it (integrations.IntegrationIO; Acts: its patch; Follows: a group it
    made, patched or deleted is read again): no start, no watch."""

    name = "gang"

    def memory(self) -> Memory:
        return Memory()

    async def read(self, kube: k8s.Kube, memory: Memory, ref: JobRef, settings: Settings) -> Gang:
        return Gang(await read_pod_group(kube, memory, ref))

    def handles(self, action: planner.Action) -> bool:
        return isinstance(action, PatchPodGroup)

    async def apply(self, kube: k8s.Kube, ref: JobRef, action: planner.Action,
                    log: logging.LoggerAdapter[logging.Logger]) -> bool:
        """PatchPodGroup: whether it took effect (its Event is then posted with the reconcile's others)."""
        assert isinstance(action, PatchPodGroup)
        try:
            await kube.patch_object(action.api_version, podgroup.PLURAL, ref.namespace, action.name, action.patch)
        except k8s.NotFound:
            return False  # gone meanwhile: read again and made anew
        return True

    def after_apply(self, memory: Memory, actions: list[planner.Action]) -> None:
        after_apply(memory, actions)


async def read_pod_group(kube: k8s.Kube, memory: Memory, ref: JobRef) -> PodGroupView | None:
    want = podgroup.desired(ref)
    if want is None:
        return None
    known = memory.groups.get(want.api_version)
    if known is not None and time.monotonic() - known[1] < RECHECK_SECONDS:
        return known[0]
    body = await kube.get_object(want.api_version, podgroup.PLURAL, ref.namespace, want.name)
    view = podgroup.pod_group_view(body) if body is not None else None
    if view is not None and view.owner_uid == ref.uid and not view.deleting:
        # Only a settled group of ours is remembered: one on its way out, or an earlier job's, is read
        # again at every reconcile until it is gone and ours can be made.
        memory.groups[want.api_version] = (view, time.monotonic())
    return view


def after_apply(memory: Memory, actions: list[planner.Action]) -> None:
    """A PodGroup the operator created or deleted is read again next time: whether it is there now (a
    deletion may wait on finalizers, a create may have been refused) is the API server's to say."""
    for action in actions:
        if isinstance(action, planner.CreateObject) and action.manifest["kind"] == "PodGroup":
            memory.groups.pop(action.manifest["apiVersion"], None)
        elif isinstance(action, planner.DeleteObject) and action.kind == "PodGroup":
            memory.groups.pop(action.api_version, None)
        elif isinstance(action, PatchPodGroup):
            memory.groups.pop(action.api_version, None)
