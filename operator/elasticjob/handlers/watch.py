"""Watches feed the mirror; the mirror says which jobs changed; their loops wake (or end).

Loops start only once every watch has listed once: a loop that ran before the pods were listed would take a
running job for one that lost its pods (and count a store loss that never happened).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from elasticjob import kueue, metrics, naming, reflector
from elasticjob.handlers import telemetry
from elasticjob.handlers.context import Context
from elasticjob.mirror import JobKey
from elasticjob.models import GROUP, PLURAL, VERSION

# Pods and Services of every job carry this label: the API server sends the operator only those.
OWNED_SELECTOR = naming.JOB_LABEL


def sources(ctx: Context, namespaces: list[str] | None) -> list[reflector.Source]:
    core, custom = ctx.kube.core, ctx.kube.custom
    found = []
    for ns in namespaces or [None]:
        if ns is None:
            jobs = functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
            pods, services = core.list_pod_for_all_namespaces, core.list_service_for_all_namespaces
        else:
            jobs = functools.partial(custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL)
            pods = functools.partial(core.list_namespaced_pod, ns)
            services = functools.partial(core.list_namespaced_service, ns)
        found += [reflector.Source("elasticjobs", ns, None, jobs),
                  reflector.Source("pods", ns, OWNED_SELECTOR, pods),
                  reflector.Source("services", ns, OWNED_SELECTOR, services)]
        if ctx.settings.kueue:
            found.append(reflector.Source("workloads", ns, OWNED_SELECTOR, workloads_of(ctx, ns)))
    if ctx.settings.kueue:
        flavors = functools.partial(custom.list_cluster_custom_object, kueue.GROUP, kueue.VERSION, kueue.FLAVORS)
        found.append(reflector.Source("resourceflavors", None, None, flavors))
    return found


def workloads_of(ctx: Context, namespace: str | None):
    """Kueue's Workloads the operator made (labelled with their job's name), in one namespace or all."""
    custom = ctx.kube.custom
    if namespace is None:
        return functools.partial(custom.list_cluster_custom_object, kueue.GROUP, kueue.VERSION, kueue.WORKLOADS)
    return functools.partial(custom.list_namespaced_custom_object, kueue.GROUP, kueue.VERSION, namespace,
                             kueue.WORKLOADS)


def start(ctx: Context, namespaces: list[str] | None) -> tuple[list[reflector.Reflector], list[asyncio.Task]]:
    """Start the watches; the loops of the jobs found start once all have listed."""
    chosen = sources(ctx, namespaces)
    threads = reflector.watch_threads(len(chosen))
    reflectors = [reflector.Reflector(source, functools.partial(listed, ctx, source.kind),
                                      functools.partial(changed, ctx, source.kind), threads, ctx.logger)
                  for source in chosen]
    tasks = [asyncio.create_task(r.run(), name=f"watch {r.where}") for r in reflectors]
    tasks.append(asyncio.create_task(start_loops_when_synced(ctx, reflectors), name="first sync"))
    return reflectors, tasks


async def start_loops_when_synced(ctx: Context, reflectors: list[reflector.Reflector]) -> None:
    await asyncio.gather(*(r.synced.wait() for r in reflectors))
    ctx.synced = True
    ctx.logger.info(f"watches synced: {len(ctx.mirror.jobs)} jobs, {len(ctx.mirror.pods)} pods, "
                    f"{len(ctx.mirror.services)} services")
    dispatch(ctx, "elasticjobs", ctx.mirror.jobs.keys())


def listed(ctx: Context, kind: str, namespace: str | None, items: list[dict[str, Any]]) -> None:
    dispatch(ctx, kind, ctx.mirror.store(kind).replace(namespace, items))


def changed(ctx: Context, kind: str, event: str, body: dict[str, Any]) -> None:
    dispatch(ctx, kind, ctx.mirror.store(kind).apply(event, body))


def dispatch(ctx: Context, kind: str, keys: set[JobKey]) -> None:
    if not ctx.synced or ctx.loops is None:
        return
    for key in keys:
        if kind != "elasticjobs":
            ctx.loops.wake(key)
        elif ctx.mirror.job(key) is not None:
            ctx.loops.observe(key)
        elif key in ctx.loops:
            ctx.spawn(ctx.loops.forget(key))
            ctx.watches.stop(key)
            metrics.forget_job(*key)
            telemetry.forget(key)
