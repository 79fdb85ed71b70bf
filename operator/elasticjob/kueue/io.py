"""Kueue, for the controller: what a reconcile reads of a job's Workloads, flavors and priority, and how it
writes to a Workload.

Workloads and ResourceFlavors are watched (controller/watch.py, when Kueue is on) and come from the mirror; a
priority class is read once per job and remembered. Creating a Workload and deleting a slice are the
controller's generic object actions (controller/apply.py); what is Kueue's own is here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from elasticjob import k8s, naming, planner
from elasticjob.domain import JobRef
from elasticjob.kueue import workloads
from elasticjob.kueue.workloads import FlavorView, Priority, WorkloadView

WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"


@dataclass
class Memory:
    # The priority, per (WorkloadPriorityClass label, pod priorityClassName) it was read for.
    priority: tuple[tuple[str | None, str | None], Priority | None] | None = None


async def observe(kube: k8s.Kube, memory: Memory, ref: JobRef, owned: tuple[WorkloadView, ...],
                  flavors: dict[str, FlavorView]) -> dict[str, Any]:
    """The Observed fields of Kueue. `owned` is read without the label too: a job whose Workload exists keeps its
    gate (kueue/admission.py)."""
    found: dict[str, Any] = {"workloads": owned, "flavors": flavors}
    if ref.label(naming.QUEUE_LABEL) is not None:  # for a Workload about to be made: the first, or a slice
        found["priority"] = await priority(kube, memory, ref)
    return found


async def priority(kube: k8s.Kube, memory: Memory, ref: JobRef) -> Priority | None:
    """What Kueue's jobframework puts in a Workload: the WorkloadPriorityClass the job's label names, else the
    PriorityClass of its pod template. (A cluster's global default PriorityClass is not looked up.)"""
    wanted = (ref.label(naming.WORKLOAD_PRIORITY_LABEL), (ref.spec.template.get("spec") or {}).get("priorityClassName"))
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
    if isinstance(action, planner.PatchWorkload):
        patch = {"metadata": {"resourceVersion": action.resource_version},
                 "spec": {"queueName": action.queue_name, "podSets": action.pod_sets}}
        try:
            await kube.patch_object(workloads.API_VERSION, workloads.WORKLOADS, ref.namespace, action.name, patch)
        except k8s.Conflict:
            return workload_changed(action.name, log)
        log.info(f"Workload {action.name} asks for the spec's counts again (queue {action.queue_name})")
        return True
    if isinstance(action, planner.ApplyWorkloadStatus):
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


HANDLED = (planner.PatchWorkload, planner.ApplyWorkloadStatus)
