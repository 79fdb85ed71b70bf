"""What a reconcile looks at besides the job: its own pods and Service (from the mirror: those the operator made), the
store's state, the readiness of nodes that hold stuck pods, and the agents' account of in-place failures."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from elasticjob import builders, domain, k8s, naming, planner
from elasticjob.agent_messages import last_worker_failure
from elasticjob.controller.context import Context, JobMemory
from elasticjob.observe import PodView, ServiceView, StoreView, parse_time
from elasticjob_store.protocol import control_port

# Agents' logs are read only when the store reports a new in-place restart (paced: JobMemory.log_reads), from at
# most this many pods.
LOG_PODS = 16
LOG_LINES = 60


async def observe(ctx: Context, memory: JobMemory, job: planner.Job, now: datetime) -> planner.Observed:
    ref = job.ref
    key = naming.job_key(ref.namespace, ref.name)
    token = ctx.stores.token(ref.uid)
    pods = planner.admit(ctx.mirror.owned_pods(key, ref.uid), job.status, token)
    taken = frozenset(p.name for p in ctx.mirror.pods.of(key)) - {p.name for p in pods}
    service_name = naming.rendezvous_service_name(ref.name, job.status.renamed)
    named = ctx.mirror.owned_service(key, ref.uid, service_name)
    service = planner.service_admitted(named, job.status, token)
    store = read_store(ctx, job, pods, service)
    nodes = await node_readiness(ctx, planner.stuck_nodes(pods, now) | planner.suspect_nodes(job, pods, store, now))
    failures, wait = await read_round_failures(ctx, memory, job, pods, store, now)
    refusal = memory.refusal
    return planner.Observed(pods=pods, service=service, store=store, nodes=nodes, round_failures=failures,
                            round_failures_wait=wait,
                            leftovers=ctx.mirror.leftovers(key, ref.uid), taken=taken,
                            squatted=tuple(memory.squatted.values()),
                            rejected_service=named if service is None else None,
                            endpoint_slices=ctx.mirror.endpoint_slices(ref.namespace, service_name),
                            refused=refusal.message if refusal else None,
                            retry_at=refusal.retry_at if refusal else None,
                            integrations=await integrations(ctx, memory, job.ref))


async def integrations(ctx: Context, memory: JobMemory, ref: domain.JobRef) -> tuple[planner.Integration, ...]:
    """What each integration sees of the job, read by its own package, in the registry's order."""
    return tuple([await i.read(ctx.kube, ctx.memory_of(memory, i), ref, ctx.settings) for i in ctx.integrations])


async def node_readiness(ctx: Context, names: set[str]) -> dict[str, bool | None]:
    """Ready per node (None: gone); a node the API server would not tell about is left out, as if unasked."""
    asked = sorted(names)
    answers = await asyncio.gather(*(ctx.kube.node_ready(n) for n in asked))
    return {name: ready for name, ready in zip(asked, answers) if not isinstance(ready, k8s.Unknown)}


def read_store(ctx: Context, job: planner.Job, pods: list[PodView], service: ServiceView | None) -> StoreView | None:
    """The store's latest state from its long-poll; the watch starts when the store serves, stops when not. It
    dials the store pod's own IP (the pod the operator made), not the Service: the token goes nowhere else."""
    key = naming.job_key(job.ref.namespace, job.ref.name)
    store = next((p for p in pods if p.role == naming.ROLE_RENDEZVOUS and p.serving and p.ip), None)
    if ctx.watches is None:
        return None
    if service is None or store is None or store.ip is None or job.status.phase.finished:
        ctx.watches.stop(key)
        return None
    address = planner.ControlAddress(store.ip, control_port(job.ref.spec.rendezvous.port))
    return ctx.watches.view(key, job.ref.uid, address, job.ref.spec.max_replicas)


async def read_round_failures(ctx: Context, memory: JobMemory, job: planner.Job, pods: list[PodView],
                              store: StoreView | None, now: datetime) -> tuple[list[planner.RoundFailure], float]:
    """Once per new in-place restart: which worker failed, and how, from the agents' log lines since the last read
    (a line read once is no evidence for a later round: the store's count is the tenant's word). Reads are paced
    per job; (failures, seconds until the next read may be made) — the round waits for it."""
    seen = job.status.rendezvous
    if store is None:
        return [], 0.0
    counted = seen.failure_rounds if store.epoch == seen.epoch else 0
    if store.failure_rounds <= counted:
        return [], 0.0
    mark = (store.epoch, store.failure_rounds)
    if memory.logs_read_for != mark:
        if not memory.log_reads.take(time.monotonic()):
            return [], max(1.0, memory.log_reads.wait(time.monotonic()))
        since = memory.logs_read_at or parse_time(job.status.last_restart_time)
        read = await agent_failures(ctx, job.ref, pods, since)
        before = {f.message for f in memory.round_failures}  # a line at the edge of `since` is not read twice
        memory.round_failures = [f for f in read if f.message not in before]
        memory.logs_read_for, memory.logs_read_at = mark, now
    return memory.round_failures, 0.0


async def agent_failures(ctx: Context, ref: domain.JobRef, pods: list[PodView],
                         since: datetime | None) -> list[planner.RoundFailure]:
    container = (builders.worker_container(ref.spec.template) or {}).get("name", naming.WORKER_CONTAINER)
    workers = [p for p in pods if p.role == naming.ROLE_WORKER and p.active and p.started][:LOG_PODS]
    logs = await asyncio.gather(*(ctx.kube.pod_log_tail(ref.namespace, p.name, container, LOG_LINES, since)
                                  for p in workers))
    found = []
    for pod, log in zip(workers, logs):
        if (failure := last_worker_failure(log)) is not None:
            found.append((failure[0], pod.name, failure[1], failure[2]))
    return [planner.RoundFailure(pod=name, exit_code=code, message=line) for _, name, code, line in sorted(found)]
