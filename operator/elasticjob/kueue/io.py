"""Kueue, for the controller (elasticjob/integrations.py): what it watches (Workloads, ResourceFlavors), what a
reconcile reads of a job's Workloads, flavors and priority, how it writes to a Workload, and whether Kueue is on.

Workloads and ResourceFlavors are watched when Kueue is on and kept in this integration's own caches; a
priority class is read once per job and remembered. Creating a Workload and deleting a slice are the
controller's generic object actions (controller/apply.py); what is Kueue's own is here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticjob import k8s, naming, planner
from elasticjob.domain import JobRef, Settings
from elasticjob.kindcache import Cache, Entry, JobKey, KindCache, Watched, labelled
from elasticjob.kueue import discovery, workloads
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import settings as kueue_settings
from elasticjob.kueue import status as kueue_status
from elasticjob.kueue.actions import ApplyWorkloadStatus, PatchWorkload
from elasticjob.kueue.admission import Kueue
from elasticjob.kueue.workloads import FlavorView, Priority, WorkloadView, flavor_view, workload_view

WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"


@dataclass
class Memory:
    # The priority, per (WorkloadPriorityClass label, pod priorityClassName) it was read for.
    priority: tuple[tuple[str | None, str | None], Priority | None] | None = None


def _workload(body: Mapping[str, Any]) -> tuple[str, Entry[WorkloadView]] | None:
    if (found := labelled(body)) is None:
        return None
    meta, key = found
    return meta["uid"], Entry(key, workload_view(body))


class Flavors:
    """Kueue's ResourceFlavors by name (cluster-scoped, no job's): their node labels go on admitted pods."""

    def __init__(self) -> None:
        self.by_name: dict[str, FlavorView] = {}

    def __len__(self) -> int:
        return len(self.by_name)

    def apply(self, kind: str, body: Mapping[str, Any]) -> set[JobKey]:
        view = flavor_view(body)
        if kind == "DELETED":
            self.by_name.pop(view.name, None)
        else:
            self.by_name[view.name] = view
        return set()  # a job waiting for a flavor it was assigned looks again within seconds

    def replace(self, namespace: str | None, bodies: Iterable[Mapping[str, Any]]) -> set[JobKey]:
        self.by_name = {view.name: view for view in map(flavor_view, bodies)}
        return set()


class KueueIO:
    """The integration as the controller runs it (integrations.IntegrationIO)."""

    name = kueue_settings.NAME
    status_part = kueue_status.PART  # status.admission (integrations.Reports)
    add_arguments = staticmethod(kueue_settings.add_arguments)
    from_arguments = staticmethod(kueue_settings.from_arguments)

    def __init__(self) -> None:
        self.workloads: KindCache[WorkloadView] = KindCache(_workload, workloads.same_to_plan)
        self.flavors = Flavors()
        self.caches: dict[str, Cache] = {"workloads": self.workloads, "resourceflavors": self.flavors}

    async def start(self, kube: k8s.Kube, settings: Settings,
                    logger: logging.Logger) -> tuple[Settings, list[Coroutine[Any, Any, None]]]:
        """Whether Kueue is on (KueueSettings.on), and, with --kueue auto, the check that restarts the operator
        when Kueue comes or goes."""
        mine = kueue_settings.of(settings)
        here = await discovery.resolve(kube, mine.mode, logger)
        follow = [discovery.follow(kube, here, logger)] if mine.mode == "auto" else []
        return kueue_settings.with_kueue(settings, dataclasses.replace(mine, on=here)), follow

    def watched(self, settings: Settings) -> list[Watched]:
        if not kueue_settings.of(settings).on:
            return []
        return [Watched("workloads", workloads.API_VERSION, workloads.WORKLOADS, label_selector=naming.JOB_LABEL),
                Watched("resourceflavors", workloads.API_VERSION, workloads.FLAVORS, namespaced=False)]

    def memory(self) -> Memory:
        return Memory()

    async def read(self, kube: k8s.Kube, memory: Memory, ref: JobRef, settings: Settings) -> Kueue:
        """The job's Workloads, read without the label too: a job whose Workload exists keeps its gate
        (kueue/admission.py)."""
        if not kueue_settings.of(settings).on:
            return Kueue()
        key = naming.job_key(ref.namespace, ref.name)
        owned = tuple(w for w in self.workloads.of(key) if w.owner_uid == ref.uid)
        found = None
        if ref.label(kueue_names.QUEUE_LABEL) is not None:  # for a Workload about to be made: the first, or a slice
            found = await priority(kube, memory, ref)
        return Kueue(owned, self.flavors.by_name, found)

    def handles(self, action: planner.Action) -> bool:
        return isinstance(action, (PatchWorkload, ApplyWorkloadStatus))

    async def apply(self, kube: k8s.Kube, ref: JobRef, action: planner.Action,
                    log: logging.LoggerAdapter[logging.Logger]) -> bool:
        return await apply(kube, ref, action, log)

    def after_apply(self, memory: Memory, actions: list[planner.Action]) -> None:
        return None  # what Kueue changes comes back through the Workloads' watch


async def priority(kube: k8s.Kube, memory: Memory, ref: JobRef) -> Priority | None:
    """What Kueue's jobframework puts in a Workload: the WorkloadPriorityClass the job's label names, else the
    PriorityClass of its pod template. (A cluster's global default PriorityClass is not looked up.)"""
    wanted = (ref.label(kueue_names.WORKLOAD_PRIORITY_LABEL),
              (ref.spec.template.get("spec") or {}).get("priorityClassName"))
    if memory.priority is not None and memory.priority[0] == wanted:
        return memory.priority[1]
    workload_class, pod_class = wanted
    if workload_class:
        body = await kube.get_object(workloads.API_VERSION, WORKLOAD_PRIORITY_CLASSES, None, workload_class)
        found = Priority(problem=f"WorkloadPriorityClass {workload_class} not found") if body is None else \
            Priority((("group", workloads.GROUP), ("kind", "WorkloadPriorityClass"), ("name", workload_class)),
                     int(body.get("value", 0)))
    elif pod_class:
        value = await kube.priority_class_value(pod_class)
        found = Priority(problem=f"PriorityClass {pod_class} not found") if value is None else \
            Priority((("group", "scheduling.k8s.io"), ("kind", "PriorityClass"), ("name", pod_class)), value)
    else:
        found = None
    if found is None or found.problem is None:  # a missing class is looked for again
        memory.priority = (wanted, found)
    return found


async def apply(kube: k8s.Kube, ref: JobRef, action: planner.Action,
                log: logging.LoggerAdapter[logging.Logger]) -> bool:
    """PatchWorkload, ApplyWorkloadStatus: whether it took effect (its Event is then posted with the reconcile's
    others)."""
    if isinstance(action, PatchWorkload):
        patch = {"metadata": {"resourceVersion": action.resource_version},
                 "spec": {"queueName": action.queue_name, "podSets": action.pod_sets}}
        try:
            await kube.patch_object(workloads.API_VERSION, workloads.WORKLOADS, ref.namespace, action.name, patch)
        except k8s.Conflict:
            return workload_changed(action.name, log)
        log.info(f"Workload {action.name} asks for the spec's counts again (queue {action.queue_name})")
        return True
    if isinstance(action, ApplyWorkloadStatus):
        try:
            await kube.apply_status(workloads.API_VERSION, workloads.WORKLOADS, action.body, workloads.FIELD_MANAGER)
        except k8s.NotFound:
            return False  # the Workload is gone (the job is being deleted)
        except k8s.Conflict:
            return workload_changed(action.body["metadata"]["name"], log)
        return True
    return False


def workload_changed(name: str, log: logging.LoggerAdapter[logging.Logger]) -> bool:
    """A write conditional on the Workload's resourceVersion lost to Kueue's own: the Workload's watch brings the
    newer version and wakes the job, which then plans from it. Reading the job again would change nothing (the
    Workload in the mirror is what was stale) and only spin until the watch caught up."""
    log.debug(f"Workload {name} changed since it was read: planning again once its watch brings the change")
    return False
