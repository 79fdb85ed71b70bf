"""Gangs and queues, for the controller: what a reconcile reads of a job's PodGroup, Kueue Workload, flavors
and priority, and how it carries out the actions on them.

PodGroups have no watch: the group is read (GET) the first time a loop needs it, again after the operator
created or deleted it, and every few minutes; in between the loop's memory says what is there. Workloads and
ResourceFlavors are watched (with --kueue) and come from the mirror. A priority class is read once per job.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from elasticjob import gang, k8s, kueue, naming, planner
from elasticjob.controller.context import Context, JobMemory
from elasticjob.domain import JobRef

# A PodGroup the operator knows is read again after this long (someone may have deleted it).
POD_GROUP_RECHECK_SECONDS = 300.0
WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"


async def observe(ctx: Context, memory: JobMemory, job: planner.Job) -> dict[str, Any]:
    """The Observed fields of gangs and queues."""
    ref = job.ref
    found: dict[str, Any] = {"pod_group": await pod_group(ctx, memory, ref)}
    if not ctx.settings.kueue:
        return found
    # Read without the label too: a job whose Workload exists keeps its gate (planner/queueing.py).
    key = naming.job_key(ref.namespace, ref.name)
    found["workloads"] = ctx.mirror.owned_workloads(key, ref.uid)
    found["flavors"] = ctx.mirror.flavors.by_name
    if ref.label(naming.QUEUE_LABEL) is not None:  # for a Workload about to be made: the first, or a slice
        found["priority"] = await priority(ctx, memory, ref)
    return found


async def pod_group(ctx: Context, memory: JobMemory, ref: JobRef) -> gang.PodGroupView | None:
    want = gang.desired(ref)
    if want is None:
        return None
    known = memory.pod_groups.get(want.api_version)
    if known is not None and time.monotonic() - known[1] < POD_GROUP_RECHECK_SECONDS:
        return known[0]
    body = await ctx.kube.get_object(want.api_version, gang.PLURAL, ref.namespace, want.name)
    view = gang.observe_pod_group(body) if body is not None else None
    if view is not None and view.owner_uid == ref.uid and not view.deleting:
        # Only a settled group of ours is remembered: one on its way out, or an earlier job's, is read
        # again at every reconcile until it is gone and ours can be made.
        memory.pod_groups[want.api_version] = (view, time.monotonic())
    return view


async def priority(ctx: Context, memory: JobMemory, ref: JobRef) -> kueue.Priority | None:
    """What Kueue's jobframework puts in a Workload: the WorkloadPriorityClass the job's label names, else the
    PriorityClass of its pod template. (A cluster's global default PriorityClass is not looked up.)"""
    wanted = (ref.label(naming.WORKLOAD_PRIORITY_LABEL), (ref.spec.template.get("spec") or {}).get("priorityClassName"))
    if memory.priority is not None and memory.priority[0] == wanted:
        return memory.priority[1]
    workload_class, pod_class = wanted
    if workload_class:
        body = await ctx.kube.get_object(kueue.API_VERSION, WORKLOAD_PRIORITY_CLASSES, None, workload_class)
        found = kueue.Priority(problem=f"WorkloadPriorityClass {workload_class} not found") if body is None else \
            kueue.Priority((("group", kueue.GROUP), ("kind", "WorkloadPriorityClass"), ("name", workload_class)),
                           int(body.get("value", 0)))
    elif pod_class:
        value = await ctx.kube.priority_class_value(pod_class)
        found = kueue.Priority(problem=f"PriorityClass {pod_class} not found") if value is None else \
            kueue.Priority((("group", "scheduling.k8s.io"), ("kind", "PriorityClass"), ("name", pod_class)), value)
    else:
        found = None
    if found is None or found.problem is None:  # a missing class is looked for again
        memory.priority = (wanted, found)
    return found


def after_apply(memory: JobMemory, actions: list[planner.Action]) -> None:
    """A PodGroup the operator created or deleted is read again next time: whether it is there now (a
    deletion may wait on finalizers, a create may have been refused) is the API server's to say."""
    for action in actions:
        if isinstance(action, planner.CreateObject) and action.manifest["kind"] == "PodGroup":
            memory.pod_groups.pop(action.manifest["apiVersion"], None)
        elif isinstance(action, (planner.DeleteObject, planner.PatchObject)) and action.kind == "PodGroup":
            memory.pod_groups.pop(action.api_version, None)


async def apply(ctx: Context, ref: JobRef, action: planner.Action, log: logging.LoggerAdapter[logging.Logger]) -> bool:
    """DeleteObject, PatchObject, PatchWorkload, ApplyWorkloadStatus: whether it took effect (its Event is then
    posted with the reconcile's others)."""
    kube = ctx.kube
    if isinstance(action, planner.DeleteObject):
        return await kube.delete_object(action.api_version, action.plural, ref.namespace, action.name, action.uid,
                                        action.resource_version)
    if isinstance(action, planner.PatchObject):
        try:
            await kube.patch_object(action.api_version, action.plural, ref.namespace, action.name, action.patch)
        except k8s.NotFound:
            return False  # gone meanwhile: read again and made anew
        return True
    if isinstance(action, planner.PatchWorkload):
        patch = {"metadata": {"resourceVersion": action.resource_version},
                 "spec": {"queueName": action.queue_name, "podSets": action.pod_sets}}
        try:
            await kube.patch_object(kueue.API_VERSION, kueue.WORKLOADS, ref.namespace, action.name, patch)
        except k8s.Conflict:
            return workload_changed(action.name, log)
        log.info(f"Workload {action.name} asks for the spec's counts again (queue {action.queue_name})")
        return True
    if isinstance(action, planner.ApplyWorkloadStatus):
        try:
            await kube.apply_status(kueue.API_VERSION, kueue.WORKLOADS, action.body, kueue.FIELD_MANAGER)
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


HANDLED = (planner.DeleteObject, planner.PatchObject, planner.PatchWorkload, planner.ApplyWorkloadStatus)
