"""Watches feed the mirror; the mirror says which jobs changed; their loops wake (or end).

Loops start only once every watch has listed once: a loop that ran before the pods were listed would take a
running job for one that lost its pods (and count a store loss that never happened).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from elasticjob import integrations, k8s, metrics, naming, rest
from elasticjob.controller import namespace_cleanup, reflector
from elasticjob.controller.context import Context
from elasticjob.controller.mirror import JobKey
from elasticjob.models import API_VERSION, PLURAL

# Pods and Services of every job carry this label: the API server sends the operator only those.
OWNED_SELECTOR = naming.JOB_LABEL
# An EndpointSlice that joins a job's rendezvous Service need carry no label of ours: every slice that names a
# Service is watched (as kube-proxy does), and the mirror keeps those that name a job's (mirror._slice).
SLICE_SELECTOR = naming.SERVICE_NAME_LABEL


def sources(ctx: Context, namespaces: list[str] | None, kube: k8s.Kube | None = None) -> list[reflector.Source]:
    kube, found = kube or ctx.kube, []
    targets: list[str | None] = list(namespaces) if namespaces else [None]
    for ns in targets:
        found += [reflector.Source("elasticjobs", ns, None, kube.lister(rest.resource(API_VERSION, ns, PLURAL))),
                  reflector.Source("pods", ns, OWNED_SELECTOR, kube.lister(rest.resource("v1", ns, "pods"))),
                  reflector.Source("services", ns, OWNED_SELECTOR, kube.lister(rest.resource("v1", ns, "services"))),
                  reflector.Source("endpointslices", ns, SLICE_SELECTOR,
                                   kube.lister(rest.resource("discovery.k8s.io/v1", ns, "endpointslices")))]
    # What the integrations watch (Kueue's Workloads in each namespace, its ResourceFlavors cluster-wide).
    for watched in [w for i in ctx.integrations if isinstance(i, integrations.Watches)
                    for w in i.watched(ctx.settings)]:
        for ns in targets if watched.namespaced else [None]:
            found.append(reflector.Source(watched.kind, ns, watched.label_selector,
                                          kube.lister(rest.resource(watched.api_version, ns, watched.plural))))
    return found


def own_client_sources(ctx: Context, namespaces: list[str] | None) -> list[reflector.Source]:
    """The sources, on a client of their own with a connection for each. A watch holds its connection for
    minutes: sharing the API threads' pool (a connection per thread), they left those threads short, and at fleet
    size a third of the operator's CPU went to TLS handshakes of connections opened for one request and dropped
    (py-spy, 1,000 jobs starting)."""
    count = len(sources(ctx, namespaces))
    return sources(ctx, namespaces, k8s.Kube(k8s.api_client(connections=count + reflector.LIST_THREADS)))


def start(ctx: Context, namespaces: list[str] | None) -> tuple[list[reflector.Reflector], list[asyncio.Task[Any]]]:
    """Start the watches; the loops of the jobs found start once all have listed."""
    chosen = own_client_sources(ctx, namespaces)
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
    dispatch(ctx, kind, ctx.cache(kind).replace(namespace, items))


def changed(ctx: Context, kind: str, event: str, body: dict[str, Any]) -> None:
    dispatch(ctx, kind, ctx.cache(kind).apply(event, body))


def dispatch(ctx: Context, kind: str, keys: set[JobKey]) -> None:
    if not ctx.synced or ctx.loops is None:
        return
    for key in keys:
        if kind != "elasticjobs":
            ctx.loops.wake(key)
        elif ctx.mirror.has_job(key):
            ctx.loops.ensure(key)
        elif key in ctx.loops:
            ctx.spawn(ctx.loops.forget(key))
            if ctx.watches is not None:
                ctx.watches.stop(key)
            metrics.forget_job(*key)
            # A replica that is not the leader writes nothing, deletions included.
            if ctx.gate.active and not ctx.mirror.has_jobs_in(key[0]):
                namespace = key[0]
                ctx.namespace_objects.retire(namespace, functools.partial(
                    namespace_cleanup.delete_policies, ctx.kube, logger=ctx.logger,
                    pods_left=functools.partial(ctx.mirror.pods.any_in, namespace),
                    jobs_back=functools.partial(ctx.mirror.has_jobs_in, namespace)))
