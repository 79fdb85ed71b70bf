"""One reconcile loop per ElasticJob: observe, plan, write status, act. Events of the job and of its
pods wake the loop; it also wakes by itself when the plan asks (deadlines, stuck pods) or every resync."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import datetime, timezone
from typing import Any

import kopf
from pydantic import ValidationError

from elasticjob import k8s, metrics, naming, peering, planner, rendezvous_client
from elasticjob.builders import JobRef
from elasticjob.models import GROUP, PLURAL, VERSION, ElasticJobSpec, ElasticJobStatus
from elasticjob.observe import PodView, ServiceView


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo,
                    job_pods: kopf.Index, job_services: kopf.Index, logger: logging.Logger, **_: Any) -> None:
    key = naming.job_key(namespace, name)
    if type == "DELETED":
        await memo.loops.forget(key)
        metrics.forget_job(namespace, name)
        return
    reconcile_job = functools.partial(reconcile_timed, kube=memo.kube, key=key, job_pods=job_pods,
                                      job_services=job_services, logger=logger,
                                      peers=getattr(memo, "peering", None))
    memo.loops.observe(key, dict(body), reconcile_job, logger)


async def reconcile_timed(body: dict[str, Any], *, kube: k8s.Kube, key: tuple[str, str], job_pods: kopf.Index,
                          job_services: kopf.Index, logger: logging.Logger,
                          peers: peering.Peering | None = None) -> float:
    started = time.monotonic()
    try:
        if peers is not None and not await active_replica(kube, peers, key[0]):
            logger.debug("another operator replica is active (kopf peering); not reconciling")
            return planner.RESYNC_SECONDS
        delay = await reconcile(body, kube, list(job_pods.get(key, [])), list(job_services.get(key, [])), logger)
        metrics.RECONCILES.labels("ok").inc()
    except k8s.NotFound:
        delay = planner.RESYNC_SECONDS  # the job is being deleted; its DELETED event ends this loop
    except k8s.KubeError as exc:
        logger.warning(f"reconcile failed, retrying: {exc}")
        metrics.RECONCILES.labels("error").inc()
        delay = 5.0
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
    return delay


async def active_replica(kube: k8s.Kube, peers: peering.Peering, namespace: str) -> bool:
    recorded = await kube.peering_peers(peers.name, None if peers.clusterwide else namespace)
    return peering.is_active(recorded, peers.identity, peers.priority, datetime.now(timezone.utc))


async def reconcile(body: dict[str, Any], kube: k8s.Kube, pods: list[PodView], services: list[ServiceView],
                    logger: logging.Logger) -> float:
    now = datetime.now(timezone.utc)
    meta = body["metadata"]
    status = ElasticJobStatus.model_validate(body.get("status") or {})
    try:
        spec = ElasticJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        logger.error(f"spec does not parse: {exc}")
        return planner.RESYNC_SECONDS
    ref = JobRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], spec=spec)
    job = planner.Job(ref=ref, generation=meta.get("generation", 0), status=status)
    service = next((s for s in services if s.name == naming.rendezvous_name(ref.name)), None)
    store_ready = any(p.role == naming.ROLE_RENDEZVOUS and p.serving for p in pods)
    rendezvous = None
    if service is not None and service.cluster_ip and store_ready:
        rendezvous = await rendezvous_client.fetch(service.cluster_ip, spec.rendezvous.port + 1)
    plan = planner.plan(job, pods, service, now, rendezvous)
    # Status first: a failure is on record before its pod is deleted, so a restart of the operator
    # between the two can neither lose nor double-count it.
    await write_status(kube, ref, status, plan.status, body, logger)
    try:
        await apply(kube, ref, plan.actions, body, logger)
    except k8s.Invalid as exc:
        rejected = planner.reject(job, plan.status, f"the API server rejected an object built from the "
                                                    f"template: {exc.message}", now)
        await write_status(kube, ref, plan.status, rejected.status, body, logger)
        post_events(body, rejected.events, logger)
    post_events(body, plan.events, logger)
    metrics.observe_job(ref.namespace, ref.name, plan.status.phase.value, plan.status.restarts)
    return plan.requeue_after


async def write_status(kube: k8s.Kube, ref: JobRef, old: ElasticJobStatus, new: ElasticJobStatus,
                       body: dict[str, Any], logger: logging.Logger) -> None:
    wire = new.model_dump(by_alias=True, mode="json")
    if wire == old.model_dump(by_alias=True, mode="json"):
        return
    await kube.patch_job_status(ref.namespace, ref.name, wire)
    if new.phase != old.phase or new.reason != old.reason:
        logger.info(f"phase {old.phase.value} -> {new.phase.value} ({new.reason}): {new.message}")


async def apply(kube: k8s.Kube, ref: JobRef, actions: list[planner.Action], body: dict[str, Any],
                logger: logging.Logger) -> None:
    results = await asyncio.gather(*(apply_one(kube, ref, action, body, logger) for action in actions),
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    invalid = next((e for e in errors if isinstance(e, k8s.Invalid)), None)
    if invalid or errors:
        raise invalid or errors[0]


async def apply_one(kube: k8s.Kube, ref: JobRef, action: planner.Action, body: dict[str, Any],
                    logger: logging.Logger) -> None:
    metrics.ACTIONS.labels(type(action).__name__).inc()
    if isinstance(action, planner.CreateObject):
        if await kube.create(action.manifest) and action.event:
            post_events(body, [action.event], logger)
    elif isinstance(action, planner.DeletePod):
        deleted = await kube.delete_pod(ref.namespace, action.name, action.uid, action.grace_seconds)
        if deleted and action.event:
            post_events(body, [action.event], logger)
    elif isinstance(action, planner.DeleteService):
        await kube.delete_service(ref.namespace, action.name)
    elif isinstance(action, planner.DefaultReplicas):
        await kube.patch_job_spec(ref.namespace, ref.name, {"replicas": action.replicas})
    elif isinstance(action, planner.DeleteJob):
        logger.info("ttlSecondsAfterFinished passed: deleting the job")
        await kube.delete_job(ref.namespace, ref.name)


def post_events(body: dict[str, Any], events: list[planner.Event], logger: logging.Logger) -> None:
    for event in events:
        log = logger.warning if event.type == "Warning" else logger.info
        log(f"{event.reason}: {event.message}")
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
