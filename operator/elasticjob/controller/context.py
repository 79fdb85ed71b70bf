"""What the controller shares: clients, the mirror, the loops, and what each job's loop remembers between runs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from elasticjob import builders, integrations, k8s, naming
from elasticjob.controller.loops import Budget, JobLoops
from elasticjob.controller.mirror import JobKey, Mirror
from elasticjob.domain import Settings
from elasticjob.integrations import IntegrationIO
from elasticjob.kindcache import Cache
from elasticjob.planner import Event, NameTaken, RoundFailure
from elasticjob.rendezvous_client import StoreClient

if TYPE_CHECKING:
    from elasticjob.controller.stores import StoreWatches

COMPONENT = "elasticjob-operator"  # the "From" of `kubectl describe ej`
# Per job: the agents' logs read for at most 3 failure rounds at once, then once per 10 s (each read is up to
# LOG_PODS requests to kubelets); Events, 30 at once (a fleet of pods created), then one per 5 s.
LOG_READ_BURST, LOG_READ_EVERY = 3.0, 10.0
EVENT_BURST, EVENT_EVERY = 30.0, 5.0


@dataclass
class Refusal:
    """The API server refused to create a job's objects: shown on the job, retried with backoff."""

    message: str
    count: int
    retry_at: datetime


@dataclass
class JobMemory:
    # The body our last write returned: newer than the mirror's until the watch catches up.
    written: dict[str, Any] | None = None
    status_written_at: float | None = None  # time.monotonic() of that write
    status_held_since: float | None = None  # when a change that may wait (see status_deferral) was first held
    refusal: Refusal | None = None
    # The store's failure rounds whose causes were read from the agents' logs, and what they said; when the logs
    # were last read (the operator's clock: the next read asks only for lines since, time.monotonic() paces it).
    logs_read_for: tuple[str, int] | None = None
    round_failures: list[RoundFailure] = field(default_factory=list)
    logs_read_at: datetime | None = None
    log_reads: Budget = field(default_factory=lambda: Budget(LOG_READ_BURST, LOG_READ_EVERY))
    # The Events a job may still post (reconcile.post_all): a store that changes its answer at every long-poll
    # must not post one each time.
    events: Budget = field(default_factory=lambda: Budget(EVENT_BURST, EVENT_EVERY))
    # What each integration remembers, by its name (the gang's PodGroup, read without a watch; the priority of
    # Kueue's Workloads): IntegrationIO.memory.
    integrations: dict[str, Any] = field(default_factory=dict)
    # Names another object held when the operator asked (409), by kind and name: the planner renames them
    # (planner/ownership.py rename_taken) and its status keeps the new names; kept here until then.
    squatted: dict[tuple[str, str], NameTaken] = field(default_factory=dict)
    # What this operator last applied, per kind and name (the rendezvous EndpointSlice): sent again only changed.
    applied: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # A node's taint was refused (403) and the job said so (NodeTaintRefused): once per job.
    taint_refused: bool = False


class NamespaceObjects:
    """Objects a namespace's jobs share (the NetworkPolicy around its stores): created per namespace by one
    request however many reconciles ask at once, and created again (a 409 where it stands) by the first
    reconcile RECHECK seconds after: a policy someone deleted comes back within that, not at the operator's next
    start. Retired when the namespace's last job leaves the mirror
    (the job watch delivers a namespace's deletions before a recreated namespace's new jobs): forgotten, so a
    namespace deleted and made again gets its objects again, and deleted, so that nothing the operator made
    outlives the jobs it was for. A create in that namespace waits for the deletion first: a new job's store is
    never left outside its policy by a deletion that lands after the create."""

    RECHECK = 30.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._creates: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self._created_at: dict[tuple[str, str], float] = {}
        self._retiring: dict[str, asyncio.Task[Any]] = {}
        self._clock = clock

    async def create(self, manifest: dict[str, Any],
                     create: Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]) -> dict[str, Any] | None:
        """The object if this call created it, else None (made by an earlier call, or already there)."""
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        if (retiring := self._retiring.get(key[0])) is not None:
            await asyncio.wait([retiring])  # its failure is its own (logged there); the create goes on
        task = self._creates.get(key)
        stale = task is not None and task.done() and self._clock() - self._created_at[key] >= self.RECHECK
        if task is not None and not stale and not (task.done() and (task.cancelled() or task.exception())):
            await asyncio.shield(task)
            return None
        task = self._creates[key] = asyncio.ensure_future(create(manifest))
        self._created_at[key] = self._clock()
        return await asyncio.shield(task)  # a failure leaves a done task with its error: the next call retries

    def forget(self, namespace: str) -> None:
        for key in [k for k in self._creates if k[0] == namespace]:
            del self._creates[key]
            self._created_at.pop(key, None)

    def retire(self, namespace: str, delete: Callable[[str], Awaitable[None]]) -> None:
        """Forget the namespace's objects and delete them (`delete(namespace)`), after any earlier deletion."""
        self.forget(namespace)
        earlier = self._retiring.get(namespace)

        async def run() -> None:
            if earlier is not None:
                await asyncio.wait([earlier])
            await delete(namespace)

        task = self._retiring[namespace] = asyncio.ensure_future(run())
        task.add_done_callback(lambda done: self._retiring.pop(namespace, None) if
                               self._retiring.get(namespace) is done else None)


class Gate:
    """Whether this replica may act: open while it holds the leader's Lease (controller/leader.py), and always
    without --leader-elect."""

    active: bool = True


@dataclass
class Context:
    kube: k8s.Kube
    mirror: Mirror
    stores: StoreClient
    settings: Settings
    logger: logging.Logger
    instance: str
    gate: Gate = field(default_factory=Gate)
    namespace_objects: NamespaceObjects = field(default_factory=NamespaceObjects)
    loops: JobLoops | None = None
    watches: StoreWatches | None = None
    synced: bool = False
    # Every integration (elasticjob/integrations.py), each with the caches of what it watches.
    integrations: tuple[IntegrationIO[Any], ...] = field(default_factory=integrations.build)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def cache(self, kind: str) -> Cache:
        """Where a watch of `kind` goes: the mirror, or the integration that watches it."""
        owner = next((i for i in self.integrations if isinstance(i, integrations.Watches) and kind in i.caches),
                     None)
        return owner.caches[kind] if owner is not None else self.mirror.cache(kind)

    def memory_of(self, memory: JobMemory, integration: IntegrationIO[Any]) -> Any:
        """What a job's loop remembers for the integration, made the first time it is asked for."""
        if integration.name not in memory.integrations:
            memory.integrations[integration.name] = integration.memory()
        return memory.integrations[integration.name]

    def spawn(self, coro: Any) -> None:
        """Fire and forget, keeping a reference until done (events must not slow a reconcile)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def post(self, body: dict[str, Any], event: Event, log: logging.LoggerAdapter[logging.Logger]) -> None:
        (log.warning if event.type == "Warning" else log.info)(f"{event.reason}: {event.message}")
        manifest = builders.event(body, event.type, event.reason, event.message, datetime.now().astimezone(),
                                  COMPONENT, self.instance)
        self.spawn(self._post(manifest, log))

    async def _post(self, manifest: dict[str, Any], log: logging.LoggerAdapter[logging.Logger]) -> None:
        try:
            await self.kube.post_event(manifest)
        except k8s.KubeError as exc:
            log.warning(f"could not post event {manifest['reason']}: {exc}")


def job_logger(logger: logging.Logger, key: JobKey, uid: str = "") -> logging.LoggerAdapter[logging.Logger]:
    """Lines prefixed [namespace/name] by kopf's formatter (text) or carrying the object (JSON)."""
    namespace, name = key
    ref = {"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob", "name": name, "uid": uid,
           "namespace": namespace}
    return logging.LoggerAdapter(logger, {"k8s_ref": ref, "k8s_skip": True})


def newest(*bodies: dict[str, Any] | None) -> dict[str, Any] | None:
    """The body with the highest resourceVersion (comparable as integers on every API server since 1.35,
    KEP-5504); the first one present when they cannot be compared."""
    present = [b for b in bodies if b is not None]
    if not present:
        return None
    try:
        return max(present, key=lambda b: int(b["metadata"]["resourceVersion"]))
    except (KeyError, TypeError, ValueError):
        return present[0]


def owner_key(body: dict[str, Any]) -> JobKey:
    meta = body["metadata"]
    return naming.job_key(meta["namespace"], meta["name"])
