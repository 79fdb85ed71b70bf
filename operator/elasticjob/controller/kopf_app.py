"""The one module that imports kopf: it runs the operator's process (start-up, the liveness probe, clean-up,
leader election) and holds every process-wide setting in one place: the clients, the watches and the loops, kept
in kopf's memo. The reconciling itself is this package's own (watch.py, reconcile.py): kopf serves no resource,
and runs standalone (its peering is not used: the replicas elect a leader on a Lease, leader.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from elasticjob import integrations, k8s, metrics
from elasticjob.controller import node_taints, watch
from elasticjob.controller.context import Context
from elasticjob.controller.leader import Elector
from elasticjob.controller.loops import JobLoops
from elasticjob.controller.mirror import Mirror
from elasticjob.controller.reconcile import reconcile
from elasticjob.controller.stores import StoreWatches
from elasticjob.rendezvous_client import StoreClient

API_THREADS = 32
# A watch silent this long (bookmarks arrive about every minute) means the operator lost the API server.
SILENT_LIMIT_SECONDS = 600.0
CLOSE_STEP_SECONDS = 5.0
LOST_LEASE_EXIT = 3


def run(config: Any, verbose: bool, log_format: str, liveness: str | None) -> None:
    """kopf's loop until SIGTERM; `config` is cli.RunConfig."""
    # kopf's formatter prefixes every line about a job with [namespace/name].
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat[log_format.upper()], log_prefix=True)
    kopf.run(clusterwide=config.namespaces is None, namespaces=config.namespaces or [], liveness_endpoint=liveness,
             standalone=True, identity=config.identity, memo=kopf.Memo(config=config))


@kopf.on.startup()  # type: ignore[arg-type]  # kopf types handlers as taking **kwargs only
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    settings.posting.enabled = False  # the loops post their own Events, exactly one per transition
    # An API server restarting for a minute must not end the operator (kopf escalates once these run out).
    settings.networking.error_backoffs = [1, 2, 5, 10, 15, 30, 30, 30]
    # kopf serves no resource of ours (the watches are the operator's own): nothing to rediscover at runtime.
    settings.scanning.disabled = True
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(API_THREADS, "kube-api"))
    config = memo.config
    ctx = Context(kube=k8s.Kube(k8s.api_client()), mirror=Mirror(), stores=StoreClient(config.key),
                  settings=config.settings, logger=logging.getLogger("elasticjob"), instance=config.identity)
    ctx.loops = JobLoops(functools.partial(reconcile, ctx), ctx.logger, config.concurrent_reconciles)
    ctx.watches = StoreWatches(ctx.stores, ctx.loops.wake)
    memo.ctx = ctx
    background = []
    for integration in ctx.integrations:  # before the watches: an integration says whether its API is served
        if isinstance(integration, integrations.Starts):
            ctx.settings, started = await integration.start(ctx.kube, ctx.settings, ctx.logger)
            background += [(integration.name, coro) for coro in started]
    memo.reflectors, memo.tasks = watch.start(ctx, config.namespaces)
    memo.tasks += [asyncio.create_task(coro, name=f"{name} background") for name, coro in background]
    if ctx.settings.taint_bad_nodes:  # the leader's sweep (the gate) of the taints no job's plan removed
        memo.tasks.append(asyncio.create_task(node_taints.sweep_forever(ctx), name="node taints"))
    metrics.LEADER.set(1)
    if config.leader is not None:
        # The watches run in every replica, so that a new leader reconciles from a warm mirror at once.
        ctx.gate.active = False
        metrics.LEADER.set(0)
        memo.elector = Elector(k8s.Kube(k8s.api_client(), ThreadPoolExecutor(1, "lease")), config.leader, ctx.logger)
        memo.tasks.append(asyncio.create_task(memo.elector.run(functools.partial(lead, ctx), lost_lease),
                                              name="leader election"))
    logger.info("elasticjob operator started")


def lead(ctx: Context) -> None:
    ctx.gate.active = True
    metrics.LEADER.set(1)
    if ctx.loops is not None:
        for key in ctx.mirror.jobs.keys():
            ctx.loops.wake(key)


def lost_lease() -> None:
    """Exit at once, as kube-controller-manager does, for the kubelet to restart the container as a fresh
    candidate. Safer than closing the gate and staying up: a reconcile in flight would still write after the
    Lease is gone (a graceful stop gives each clean-up step 5 s), and each job's memory of writes, refusals and
    taken names would carry over from a term this replica no longer holds. A restarted operator starts from
    the API server's state alone, as after any restart."""
    metrics.LEADER.set(0)
    logging.getLogger("elasticjob").error("exiting: this replica lost the leader's Lease; the kubelet restarts it")
    logging.shutdown()
    os._exit(LOST_LEASE_EXIT)


@kopf.on.probe(id="watches")
def watches(memo: kopf.Memo, **_: Any) -> float:
    """Seconds since the quietest watch last heard from the API server; fails liveness past the limit."""
    reflectors = getattr(memo, "reflectors", [])
    silent = max((r.silent_for() for r in reflectors), default=0.0)
    if silent > SILENT_LIMIT_SECONDS:
        raise kopf.PermanentError(f"a watch has heard nothing from the API server for {silent:.0f}s")
    return round(silent, 1)


@kopf.on.cleanup()  # type: ignore[arg-type]
async def close(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Each step bounded: a shutdown that hangs is SIGKILLed by the kubelet after the grace period, losing
    whatever the remaining steps would have closed; the log names the step that overran."""
    for task in getattr(memo, "tasks", []):
        task.cancel()
    await bounded("the watches and background tasks", asyncio.gather(*getattr(memo, "tasks", []),
                                                                     return_exceptions=True), logger)
    ctx: Context | None = getattr(memo, "ctx", None)
    if ctx is not None:
        if ctx.watches is not None:
            ctx.watches.stop_all()
        stopped = ctx.loops is None or await bounded("the job loops", ctx.loops.stop_all(), logger)
        elector: Elector | None = getattr(memo, "elector", None)
        # Only once no reconcile can write any more: the next leader starts at its next read of the Lease.
        if elector is not None and stopped:
            await bounded("releasing the Lease", elector.release(), logger)
        if elector is not None:
            elector.kube.close()
        await bounded("the store connections", ctx.stores.close(), logger)
        ctx.kube.close()


async def bounded(what: str, step: Awaitable[Any], logger: logging.Logger) -> bool:
    """Whether the step finished in time."""
    try:
        await asyncio.wait_for(step, CLOSE_STEP_SECONDS)
    except TimeoutError:
        logger.warning(f"shutdown: {what} did not stop within {CLOSE_STEP_SECONDS:.0f}s; going on without them")
        return False
    return True
