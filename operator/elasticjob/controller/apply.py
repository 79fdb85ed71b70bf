"""Carry out a plan's actions: objects before the pods that need them, concurrently within each wave.

A refusal (403: Pod Security, an exhausted ResourceQuota, RBAC, a webhook) is returned, in the API server's
words, for the job to show; 422 (an object the API server finds invalid) is raised as the spec's fault. A node's
taint refused (no RBAC over nodes) is returned apart: the job says so once and goes on avoiding the node itself.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from elasticjob import integrations, k8s, metrics, naming, planner
from elasticjob.controller import node_taints
from elasticjob.controller.context import Context, JobMemory
from elasticjob.domain import JobRef
from elasticjob.models import API_VERSION, KIND
from elasticjob_store.protocol import ActionReply, ErrorReply

MAX_EVENT_MESSAGE = 1024  # events.k8s.io's limit on a note; core Events are read through it


def waves(actions: list[planner.Action]) -> tuple[list[planner.Action], list[planner.Action]]:
    """Service and NetworkPolicy first: workers need the ClusterIP, the store its fence."""
    def early(action: planner.Action) -> bool:
        return isinstance(action, planner.CreateObject) and action.manifest["kind"] != "Pod"
    return [a for a in actions if early(a)], [a for a in actions if not early(a)]


@dataclass
class Applied:
    refusal: str | None = None  # the API server's words when it refused to create something
    created: list[str] = field(default_factory=list)  # kinds of the objects created (all in the mirror now)
    taken: list[planner.NameTaken] = field(default_factory=list)  # names another object held (409)
    taint_refused: str | None = None  # the API server's words when it refused to taint a node (403: no RBAC)


async def apply(ctx: Context, ref: JobRef, actions: list[planner.Action], outbox: list[planner.Event],
                log: logging.LoggerAdapter[logging.Logger]) -> Applied:
    """Apply the actions; what was created, and the API server's message when it refused to create something.
    Created Pods and Services go into the mirror at once (the next plan sees them without waiting for the
    watch, and never creates them twice). The Events of the actions that took effect go to `outbox`, those of
    one kind as one (four CreatedWorker: one Event), also when another action failed."""
    applied, errors, events = Applied(), [], list[planner.Event]()
    for wave in waves(actions):
        results = await asyncio.gather(*(apply_one(ctx, ref, a, log) for a in wave), return_exceptions=True)
        for action, result in zip(wave, results):
            if isinstance(result, k8s.Forbidden) and isinstance(action, (planner.TaintNode, planner.UntaintNode)):
                applied.taint_refused = applied.taint_refused or result.message
            elif isinstance(result, k8s.Forbidden):
                applied.refusal = applied.refusal or result.message
            elif isinstance(result, BaseException):
                errors.append(result)
            elif isinstance(result, planner.NameTaken):
                applied.taken.append(result)
            elif result is not None:
                event = getattr(action, "event", None)
                if isinstance(event, planner.Event):
                    events.append(event)
                if isinstance(result, dict):
                    # Known to the mirror now, by this reply or by the watch that was quicker: counted as made
                    # either way (a Service made now means the workers can be made at once).
                    ctx.mirror.add_created(result)
                    applied.created.append(result.get("kind", ""))
    outbox += merged(events)
    invalid = next((e for e in errors if isinstance(e, k8s.Invalid)), None)
    if invalid or errors:
        raise invalid or errors[0]
    return applied


def unapplied(applied: dict[tuple[str, str], dict[str, Any]], actions: list[planner.Action]) -> list[planner.Action]:
    """The plan less the objects to apply that are as this operator last applied them, and the nodes' taints as
    this job last sent them (each plan asks for them all); an empty EndpointSlice is never the first thing written
    (nothing to take back: the Service has routed nowhere yet)."""
    def needed(action: planner.Action) -> bool:
        if isinstance(action, planner.TaintNode):
            return applied.get(("Node", action.node)) != taint_sent(action)
        if not isinstance(action, planner.ApplyObject):
            return True
        manifest = action.manifest
        last = applied.get((manifest["kind"], manifest["metadata"]["name"]))
        return manifest != last and not (last is None and not manifest.get("endpoints", True))
    return [a for a in actions if needed(a)]


def remember_applied(applied: dict[tuple[str, str], dict[str, Any]], actions: list[planner.Action]) -> None:
    for action in actions:
        if isinstance(action, planner.ApplyObject):
            applied[(action.manifest["kind"], action.manifest["metadata"]["name"])] = action.manifest
        elif isinstance(action, planner.TaintNode):
            applied[("Node", action.node)] = taint_sent(action)
        elif isinstance(action, planner.UntaintNode):
            applied.pop(("Node", action.node), None)


def taint_sent(action: planner.TaintNode) -> dict[str, Any]:
    return {k: v for k, v in asdict(action).items() if k != "event"}


def refused_taints(memory: JobMemory, applied: Applied) -> list[planner.Event]:
    """The first time the job's taint of a node was refused (403: the operator may not patch nodes), a Warning
    Event; the job goes on avoiding its nodes by itself, and is not told again."""
    if applied.taint_refused is None or memory.taint_refused:
        return []
    memory.taint_refused = True
    return [planner.Event("Warning", "NodeTaintRefused", f"the operator may not taint the nodes this job avoids "
                          f"(--taint-bad-nodes without the chart's badNodes.taint RBAC?): {applied.taint_refused}; "
                          f"the job's own pods keep off them all the same")]


def merged(events: list[planner.Event]) -> list[planner.Event]:
    """One Event per (type, reason), its messages joined, in the order first seen."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for event in events:
        by_reason.setdefault((event.type, event.reason), []).append(event.message)
    return [planner.Event(kind, reason, "; ".join(messages)[:MAX_EVENT_MESSAGE])
            for (kind, reason), messages in by_reason.items()]


async def apply_one(ctx: Context, ref: JobRef, action: planner.Action, log: logging.LoggerAdapter[logging.Logger]
                    ) -> dict[str, Any] | bool | planner.NameTaken | None:
    """The created object, True for another action that took effect, None for one that found it done, the name
    when another object holds it."""
    metrics.ACTIONS.labels(type(action).__name__).inc()
    kube = ctx.kube
    if isinstance(action, planner.CreateObject):
        try:
            if action.per_namespace:
                return await ctx.namespace_objects.create(action.manifest, kube.create)
            created = await kube.create(action.manifest, action.plural)
            if created is None and action.manifest["kind"] in ("Pod", "Service"):
                return await holder(ctx, ref, action.manifest)
            return created
        except k8s.NotFound as exc:  # the API server does not serve this kind (e.g. no NetworkPolicy API)
            if action.plural is not None:  # an integration's object (a PodGroup, a Workload): the job waits for it
                raise k8s.Forbidden(404, "NotFound", f"the API server does not serve "
                                    f"{action.manifest['apiVersion']} {action.manifest['kind']}") from None
            log.warning(f"could not create {action.manifest['kind']}: {exc.message}")
            return None
    if isinstance(action, planner.ApplyObject):
        await kube.apply(action.manifest)
        return True
    if isinstance(action, planner.DeletePod):
        return await kube.delete_pod(ref.namespace, action.name, action.uid, action.grace_seconds) or None
    if isinstance(action, planner.CollectLeftover):
        return await collect(ctx, ref, action) or None
    if isinstance(action, planner.TaintNode):
        return await node_taints.taint(kube, action) or None
    if isinstance(action, planner.UntaintNode):
        return await node_taints.untaint(kube, action.node, datetime.now(UTC)) or None
    if isinstance(action, planner.DeleteService):
        await kube.delete_service(ref.namespace, action.name, action.uid or None)
    elif isinstance(action, planner.DeleteJob):
        log.info("ttlSecondsAfterFinished passed: deleting the job")
        await kube.delete_job(ref.namespace, ref.name, ref.uid)
    elif isinstance(action, planner.StoreAction):
        return await nudge(ctx, ref, action, log) or None
    elif isinstance(action, planner.DeleteObject):
        return await ctx.kube.delete_object(action.api_version, action.plural, ref.namespace, action.name,
                                            action.uid, action.resource_version) or None
    elif isinstance(action, planner.IntegrationAction):
        owner = next(i for i in ctx.integrations if isinstance(i, integrations.Acts) and i.handles(action))
        return await owner.apply(kube, ref, action, log) or None  # the one that planned it
    return None


async def holder(ctx: Context, ref: JobRef, manifest: dict[str, Any]) -> planner.NameTaken | None:
    """Whose is the name a create was refused for (409)? One labelled with the job's name and controlled by an
    ElasticJob the watch shows, and the planner judges (the job's own, a forgery under it, an earlier job's
    leftover): None, as done. Any other object would hold the name for ever, unseen: the name is taken, with a
    random suffix for the planner to take instead."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    meta = await ctx.kube.metadata(kind, ref.namespace, name)
    if meta is None:
        return None  # gone meanwhile: asked for again at the next reconcile
    owner: dict[str, Any] = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), {})
    if (meta.get("labels") or {}).get(naming.JOB_LABEL) == ref.name and (
            owner.get("apiVersion"), owner.get("kind")) == (API_VERSION, KIND):
        return None
    suffix = "".join(secrets.choice(naming.SUFFIX_ALPHABET) for _ in range(naming.SUFFIX_LENGTH))
    return planner.NameTaken(kind, name, meta.get("uid", ""), suffix)


async def nudge(ctx: Context, ref: JobRef, action: planner.StoreAction,
                log: logging.LoggerAdapter[logging.Logger]) -> bool:
    """One control request to the job's store: whether the store changed the rendezvous (a repeat finds it
    done; only then is its Event posted), a refusal or an error in the log."""
    reply = await ctx.stores.act(action.endpoint.host, action.endpoint.port, ref.uid, action.request)
    done = isinstance(reply, ActionReply) and reply.changed
    metrics.STORE_ACTIONS.labels(action.kind, "done" if done else "noop").inc()
    trouble = reply.error if isinstance(reply, ErrorReply) else reply.refused
    if not done and trouble:
        log.info(f"store {action.kind} {action.request.to_wire()}: {trouble}")
    return done


async def collect(ctx: Context, ref: JobRef, action: planner.CollectLeftover) -> bool:
    """Delete what an earlier job of this name left, once a fresh read shows this job holds the name: a name
    holds one object at a time, so the leftover's owner is gone (on a stale view, an old job's loop could
    otherwise delete a newer job's pods)."""
    try:
        current = await ctx.kube.get_job(ref.namespace, ref.name)
    except k8s.NotFound:
        return False
    if current["metadata"]["uid"] != ref.uid:
        return False
    left = action.leftover
    owner = await ctx.kube.controller_ref(left.kind, ref.namespace, left.name)
    if owner is None or (owner.get("kind"), owner.get("name"), owner.get("uid")) != (
            "ElasticJob", ref.name, left.owner_uid):
        return False  # not an earlier job of this name's (someone else's object with our labels), or replaced
    if left.kind == "Pod":
        return await ctx.kube.delete_pod(ref.namespace, left.name, left.uid, None)
    return await ctx.kube.delete_service(ref.namespace, left.name, left.uid)
