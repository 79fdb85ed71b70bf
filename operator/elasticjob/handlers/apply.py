"""Carry out a plan's actions: objects before the pods that need them, concurrently within each wave.

A refusal (403: Pod Security, an exhausted ResourceQuota, RBAC, a webhook) is returned, in the API server's
words, for the job to show; 422 (an object the API server finds invalid) is raised as the spec's fault.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from elasticjob import k8s, metrics, planner
from elasticjob.builders import JobRef
from elasticjob.handlers import scheduling
from elasticjob.handlers.context import Context


def waves(actions: list[planner.Action]) -> tuple[list[planner.Action], list[planner.Action]]:
    """Service, Secret and NetworkPolicy first: the store pod mounts the Secret, workers need the ClusterIP."""
    def early(action: planner.Action) -> bool:
        return isinstance(action, planner.CreateObject) and action.manifest["kind"] != "Pod"
    return [a for a in actions if early(a)], [a for a in actions if not early(a)]


async def apply(ctx: Context, ref: JobRef, actions: list[planner.Action], body: dict[str, Any],
                log: logging.LoggerAdapter) -> str | None:
    """Apply the actions; the API server's message when it refused to create something."""
    refusals: list[str] = []
    errors: list[BaseException] = []
    for wave in waves(actions):
        results = await asyncio.gather(*(apply_one(ctx, ref, a, body, log) for a in wave), return_exceptions=True)
        for result in results:
            if isinstance(result, k8s.Forbidden):
                refusals.append(result.message)
            elif isinstance(result, BaseException):
                errors.append(result)
    invalid = next((e for e in errors if isinstance(e, k8s.Invalid)), None)
    if invalid or errors:
        raise invalid or errors[0]
    return refusals[0] if refusals else None


async def apply_one(ctx: Context, ref: JobRef, action: planner.Action, body: dict[str, Any],
                    log: logging.LoggerAdapter) -> None:
    metrics.ACTIONS.labels(type(action).__name__).inc()
    kube = ctx.kube
    if isinstance(action, planner.CreateObject):
        try:
            created = await kube.create(action.manifest)
        except k8s.NotFound as exc:  # the API server does not serve this kind (e.g. no NetworkPolicy API)
            if action.manifest["kind"] in k8s.CUSTOM_PLURALS:  # a PodGroup or Workload: the job waits for it
                raise k8s.Forbidden(404, "NotFound", f"the API server does not serve "
                                    f"{action.manifest['apiVersion']} {action.manifest['kind']}") from None
            log.warning(f"could not create {action.manifest['kind']}: {exc.message}")
            return
        if created and action.event:
            ctx.post(body, action.event, log)
    elif isinstance(action, planner.DeletePod):
        deleted = await kube.delete_pod(ref.namespace, action.name, action.uid, action.grace_seconds)
        if deleted and action.event:
            ctx.post(body, action.event, log)
    elif isinstance(action, planner.DeleteService):
        await kube.delete_service(ref.namespace, action.name, action.uid or None)
    elif isinstance(action, planner.DeleteJob):
        log.info("ttlSecondsAfterFinished passed: deleting the job")
        await kube.delete_job(ref.namespace, ref.name, ref.uid)
    elif isinstance(action, planner.StoreAction):
        await nudge(ctx, ref, action, body, log)
    elif isinstance(action, scheduling.HANDLED):
        await scheduling.apply(ctx, ref, action, body, log)


async def nudge(ctx: Context, ref: JobRef, action: planner.StoreAction, body: dict[str, Any],
                log: logging.LoggerAdapter) -> None:
    """One control request to the job's store; its Event only when the store changed the rendezvous (a repeat
    finds it done), its answer in the log."""
    host, port = action.endpoint.rsplit(":", 1)
    reply = await ctx.stores.act(host, int(port), ref.uid, action.kind, action.body)
    done = reply.get("changed") is True
    metrics.STORE_ACTIONS.labels(action.kind, "done" if done else "noop").inc()
    if done and action.event:
        ctx.post(body, action.event, log)
    elif reply.get("refused") or reply.get("error"):
        log.info(f"store {action.kind} {action.body}: {reply.get('refused') or reply.get('error')}")
