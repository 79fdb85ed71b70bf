"""One reconcile of one job: observe, plan, write status, act, post events.

Writes are optimistic: status goes to the API server only if the job is still at the resourceVersion it was
planned from. A reconcile that started from a stale body (a pod event can arrive before the job's own
MODIFIED event) gets a 409, reads the job again and plans anew, so a newer status is never overwritten.
What the server returns is the loop's latest body.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from pydantic import ValidationError

from elasticjob import backoff, integrations, k8s, metrics, planner
from elasticjob.controller import observing, telemetry, unparsable
from elasticjob.controller.apply import apply, refused_taints, remember_applied, unapplied
from elasticjob.controller.context import EVENT_BURST, EVENT_EVERY, Context, JobMemory, Refusal, job_logger, newest
from elasticjob.controller.loops import Failed, JobLoop
from elasticjob.controller.mirror import JobKey, without_managed_fields
from elasticjob.domain import JobRef
from elasticjob.models import ElasticJobSpec, ElasticJobStatus
from elasticjob.observe import parse_time

CONFLICT_RETRIES = 3
STATUS_BATCH = 2.0
STATUS_INTERVAL = 2.0
# Status fields the planner derives afresh from the cluster at every reconcile (see status_deferral): counts,
# messages, the Service's address, the store's round and its identity (a new epoch alone counts nothing: what is
# counted against it, failureRounds, goes out at once), the uids of the operator's pods and of its Service
# (planner/ownership.py: a making's serial goes out before it is made, so a copy of an earlier making is refused
# whether its successor's uid went out or not). Not the store's readiness: a lost store is counted against the
# readiness last written.
OBSERVED_FIELDS: dict[str, Any] = {"replicas": True, "ready_replicas": True, "message": True,
                                   "owned_pods": {"__all__": {"uid"}},
                                   "rendezvous": {"round", "nodes", "endpoint", "epoch", "service_uid"}}
# Never a reason to write on its own, only carried by the next write: the store's identity matters only with
# what is counted against it, and that goes out at once, with it.
CARRIED_FIELDS: dict[str, Any] = {"rendezvous": {"epoch"}}
NEVER = float("inf")


async def reconcile(ctx: Context, loop: JobLoop) -> float:
    memory: JobMemory = loop.memory or JobMemory()
    loop.memory = memory
    key = cast(JobKey, loop.key)
    current = ctx.mirror.job(key)
    if current is None:
        return planner.RESYNC_SECONDS  # gone: the mirror's next dispatch ends this loop
    uid = current["metadata"]["uid"]
    written = memory.written if memory.written and memory.written["metadata"].get("uid") == uid else None
    body = newest(current, written) or current
    if body is current:
        memory.written = None  # the watch has caught up; 4.5 KB a job less to hold at fleet size
    log = job_logger(ctx.logger, key, uid)
    if not ctx.gate.active:
        log.debug("not the leader: not reconciling")
        return planner.RESYNC_SECONDS
    started = time.monotonic()
    try:
        delay = await reconcile_fresh(ctx, memory, body, log)
        metrics.RECONCILES.labels("ok").inc()
    except k8s.NotFound:
        delay = planner.RESYNC_SECONDS  # deleted meanwhile; the mirror ends this loop
    except k8s.KubeError as exc:
        metrics.RECONCILES.labels("error").inc()
        raise Failed(str(exc), log) from exc  # the loop retries it with backoff
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
    return delay


async def reconcile_fresh(ctx: Context, memory: JobMemory, body: dict[str, Any],
                          log: logging.LoggerAdapter[logging.Logger]) -> float:
    """Reconcile; on a lost write race, read the job again and plan anew."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return await reconcile_body(ctx, memory, body, log)
        except k8s.Conflict:
            meta = body["metadata"]
            log.debug("the job changed since it was read: reading it again and planning anew")
            body = memory.written = without_managed_fields(await ctx.kube.get_job(meta["namespace"], meta["name"]))
    return 1.0


async def reconcile_body(ctx: Context, memory: JobMemory, body: dict[str, Any],
                         log: logging.LoggerAdapter[logging.Logger]) -> float:
    meta = body["metadata"]
    try:
        spec = ElasticJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        return await refuse_spec(ctx, memory, body, exc, log)
    now = datetime.now(UTC)
    ref = JobRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], spec=spec,
                 labels=tuple(sorted((meta.get("labels") or {}).items())))
    job = planner.Job(ref=ref, generation=meta.get("generation", 0),
                      status=ElasticJobStatus.model_validate(body.get("status") or {}),
                      created=parse_time(meta.get("creationTimestamp")))
    observed = await observing.observe(ctx, memory, job, now)
    plan = planner.plan(job, observed, now, ctx.settings, ctx.stores.token(ref.uid))
    spec_patch, spec_events = planner.spec_changes(plan.actions)
    if spec_patch:
        # The spec first (the replicas default, a gate's suspend): the status planned here was planned without it.
        memory.written = without_managed_fields(
            await ctx.kube.patch_job_spec(ref.namespace, ref.name, spec_patch, meta["resourceVersion"]))
        post_all(ctx, memory, memory.written, spec_events, log)
        return 0.0
    defer = status_deferral(memory, job.status, plan.status)
    if defer is None:
        body = await write_status(ctx, memory, job.status, plan.status, body, log)
    telemetry.record(meta, job.status, plan.status, now)
    for integration in ctx.integrations:  # what they change is read again next time, whatever happens
        if isinstance(integration, integrations.Follows):
            integration.after_apply(ctx.memory_of(memory, integration), plan.actions)
    actions = unapplied(memory.applied, plan.actions)
    outbox = list(plan.events)  # posted once, after the status write and the actions, whatever happens
    try:
        applied = await apply(ctx, ref, actions, outbox, log)
        outbox += refused_taints(memory, applied)
        if applied.refusal is None:
            remember_applied(memory.applied, actions)
        memory.squatted |= {(t.kind, t.name): t for t in applied.taken}
    except k8s.Invalid as exc:
        rejected = planner.reject(job, plan.status, f"the API server rejected an object built from the "
                                                    f"template: {exc.message}", now)
        body = await write_status(ctx, memory, plan.status, rejected.status, body, log)
        outbox += rejected.events
        return planner.RESYNC_SECONDS
    finally:
        post_all(ctx, memory, body, outbox, log)
    ledger = plan.status.goodput
    metrics.observe_job(ref.namespace, ref.name, plan.status.phase.value, plan.status.restarts,
                        ledger.goodput_percent if ledger else None, ledger.weighted_goodput_percent if ledger else None)
    delay = remember_refusal(ctx, memory, plan, applied.refusal, body, now, log)
    if "Service" in applied.created or applied.taken:
        return 0.0  # the workers wait for its ClusterIP, which the mirror now holds; or a taken name is renamed
    return delay if defer is None else min(delay, defer)


async def refuse_spec(ctx: Context, memory: JobMemory, body: dict[str, Any], exc: ValidationError,
                      log: logging.LoggerAdapter[logging.Logger]) -> float:
    """A spec that does not parse fails the job once per generation (controller/unparsable.py). Retrying cannot
    help, so the loop waits for the spec to change: an edit is a watch event, and wakes it."""
    status = ElasticJobStatus.model_validate(body.get("status") or {})
    generation = body["metadata"].get("generation", 0)
    if unparsable.reported(status, generation):
        return NEVER
    said = unparsable.message(exc)
    new = unparsable.failed(status, generation, said, datetime.now(UTC))
    body = await write_status(ctx, memory, status, new, body, log)
    post_all(ctx, memory, body, [planner.Event("Warning", "InvalidSpec", said)], log)
    return NEVER


def post_all(ctx: Context, memory: JobMemory, body: dict[str, Any], events: list[planner.Event],
             log: logging.LoggerAdapter[logging.Logger]) -> None:
    """Every Event of a reconcile goes out here, against the job as last written, within the job's budget (what
    the store reports is the tenant's word, and could otherwise post one at every answer)."""
    dropped = 0
    for event in events:
        if memory.events.take(time.monotonic()):
            ctx.post(body, event, log)
        else:
            dropped += 1
    if dropped:
        log.info(f"{dropped} event(s) not posted: the job posted {EVENT_BURST:.0f} lately (one more per "
                 f"{EVENT_EVERY:.0f} s)")


def remember_refusal(ctx: Context, memory: JobMemory, plan: planner.Plan, refused: str | None,
                     body: dict[str, Any], now: datetime, log: logging.LoggerAdapter[logging.Logger]) -> float:
    """Put a refusal on the job at once (re-plan now), back off before creating again, clear it once a
    create goes through."""
    if refused is not None:
        count = memory.refusal.count + 1 if memory.refusal else 1
        wait = backoff.step(backoff.REFUSED_CREATE, count - 1)
        memory.refusal = Refusal(refused, count, now + timedelta(seconds=wait))
        post_all(ctx, memory, body, [planner.Event("Warning", "FailedCreate", f"{refused} (retrying in {wait}s)")],
                 log)
        return 0.0
    if memory.refusal is not None and any(isinstance(a, planner.CreateObject) for a in plan.actions):
        memory.refusal = None
        return 0.0
    return plan.requeue_after


def status_deferral(memory: JobMemory, old: ElasticJobStatus, new: ElasticJobStatus) -> float | None:
    """Seconds to hold back a status write, or None to write now. Only what is read off the cluster again at
    every reconcile and never used as memory (pod counts, messages, the endpoint, the store's round) waits: until
    STATUS_BATCH after the first such change was held, and STATUS_INTERVAL after the last write, so that the
    changes of a job starting or changing fast go out together, as the Job controller batches pod updates. The
    phase and whatever is counted or remembered (restarts, failures, admission, times) go out before any
    action, as always, and take whatever was held with them."""
    if old == new or _durable(old) != _durable(new):
        return None
    if _dump(old, exclude=CARRIED_FIELDS) == _dump(new, exclude=CARRIED_FIELDS):
        return NEVER
    now = time.monotonic()
    if memory.status_held_since is None:
        memory.status_held_since = now
    due = memory.status_held_since + STATUS_BATCH
    if memory.status_written_at is not None:
        due = max(due, memory.status_written_at + STATUS_INTERVAL)
    return due - now if due > now else None


def _dump(status: ElasticJobStatus, **fields: Any) -> dict[str, Any]:
    return status.model_dump(by_alias=True, mode="json", **fields)


def _durable(status: ElasticJobStatus) -> dict[str, Any]:
    durable = _dump(status, exclude=OBSERVED_FIELDS)
    for condition in durable.get("conditions") or ():
        condition.pop("message", None)  # "3/4 workers ready": a count; its type, status and reason are not
    return durable


async def write_status(ctx: Context, memory: JobMemory, old: ElasticJobStatus, new: ElasticJobStatus,
                       body: dict[str, Any], log: logging.LoggerAdapter[logging.Logger]) -> dict[str, Any]:
    wire = new.model_dump(by_alias=True, mode="json")
    if wire == old.model_dump(by_alias=True, mode="json"):
        memory.status_held_since = None
        return body
    meta = body["metadata"]
    result = await ctx.kube.patch_job_status(meta["namespace"], meta["name"], wire, meta["resourceVersion"])
    memory.written, memory.status_written_at = without_managed_fields(result), time.monotonic()
    memory.status_held_since = None
    if new.phase != old.phase or new.reason != old.reason:
        log.info(f"phase {old.phase.value} -> {new.phase.value} ({new.reason}): {new.message}")
    return result
