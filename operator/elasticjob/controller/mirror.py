"""What the operator knows of the cluster: its jobs, the pods and Services labelled with a job's name, and the
EndpointSlices that name a job's rendezvous Service. Pure.

Watches feed it one event at a time; a (re)list replaces everything it held for that namespace, so an object
deleted while no watch ran (an API server restart, a 410 Gone, an operator restart) leaves the mirror with the
next list. kopf's indexes never drop an object without a DELETED event; that is why this exists.

Every change reports the job keys it touched, so that exactly those jobs are woken. Updates that change nothing
the planner looks at (a new resourceVersion, a kubelet heartbeat) wake no one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from elasticjob import naming
from elasticjob.kindcache import Cache, Entry, JobKey, KindCache, labelled
from elasticjob.observe import PodView, ServiceView, SliceView, pod_view, service_view, slice_view
from elasticjob.planner import Leftover

__all__ = ["JobKey", "KindCache", "Mirror", "StoredJob", "without_managed_fields"]


def _pod(body: Mapping[str, Any]) -> tuple[str, Entry[PodView]] | None:
    if (found := labelled(body)) is None:
        return None
    meta, key = found
    return meta["uid"], Entry(key, pod_view(body))


def _service(body: Mapping[str, Any]) -> tuple[str, Entry[ServiceView]] | None:
    if (found := labelled(body)) is None:
        return None
    meta, key = found
    return meta["uid"], Entry(key, service_view(body))


def _slice(body: Mapping[str, Any]) -> tuple[str, Entry[SliceView]] | None:
    """Any EndpointSlice whose Service name is a job's rendezvous Service's, whoever made it and whatever its other
    labels (one that joins the Service need carry no job label): by the job that name belongs to, whose loop its
    changes wake."""
    meta = body.get("metadata") or {}
    service = (meta.get("labels") or {}).get(naming.SERVICE_NAME_LABEL) or ""
    job = naming.job_of_rendezvous_service(service)
    if job is None or not meta.get("uid"):
        return None
    return meta["uid"], Entry(naming.job_key(meta.get("namespace", ""), job), slice_view(body))


def without_managed_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """Nothing here reads managedFields, and at fleet size they are a large share of what is kept per job."""
    meta = body.get("metadata") or {}
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job's body kept as its JSON: at fleet size a body of dicts was 4.6 KB a job, and each status write
    replaced hundreds of small objects, which left the allocator's arenas full of holes. Decoded per reconcile
    (tens of microseconds)."""

    resource_version: str
    created: str
    raw: bytes

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = orjson.loads(self.raw)
        return body


def _job(body: Mapping[str, Any]) -> tuple[str, Entry[StoredJob]] | None:
    meta = body.get("metadata") or {}
    if not meta.get("uid") or not meta.get("name"):
        return None
    raw = orjson.dumps(without_managed_fields(body))
    stored = StoredJob(meta.get("resourceVersion") or "", meta.get("creationTimestamp") or "", raw)
    return meta["uid"], Entry(naming.job_key(meta.get("namespace", ""), meta["name"]), stored)


def _same_version(a: StoredJob, b: StoredJob) -> bool:
    return a.resource_version == b.resource_version


class Mirror:
    """Jobs (whole bodies, kept as JSON: the planner needs the spec), their pods, Services and the EndpointSlices
    of their rendezvous Services (views: what it decides on). The integrations keep their own kinds (Kueue's
    Workloads) in caches of their own (Context.cache)."""

    def __init__(self) -> None:
        self.jobs: KindCache[StoredJob] = KindCache(_job, _same_version)
        self.pods: KindCache[PodView] = KindCache(_pod)
        self.services: KindCache[ServiceView] = KindCache(_service)
        self.slices: KindCache[SliceView] = KindCache(_slice)
        self._caches: dict[str, Cache] = {
            "elasticjobs": self.jobs, "pods": self.pods, "services": self.services, "endpointslices": self.slices}

    def cache(self, kind: str) -> Cache:
        return self._caches[kind]

    def add_created(self, body: Mapping[str, Any]) -> bool:
        """A Pod or Service this operator created (see KindCache.add_created); other kinds are not mirrored."""
        caches: dict[str, KindCache[Any]] = {"Pod": self.pods, "Service": self.services}
        cache = caches.get(body.get("kind", ""))
        return cache is not None and cache.add_created(body)

    def has_job(self, key: JobKey) -> bool:
        """Whether a job of that name is known, without decoding its body."""
        return bool(self.jobs.of(key))

    def has_jobs_in(self, namespace: str) -> bool:
        return self.jobs.any_in(namespace)

    def job(self, key: JobKey) -> dict[str, Any] | None:
        """The job now under that name; while an old job of that name is still being removed, the newest."""
        stored = self.jobs.of(key)
        if not stored:
            return None
        return max(stored, key=lambda job: job.created).body()

    def owned_pods(self, key: JobKey, uid: str) -> list[PodView]:
        """Pods this very job made: a pod left by an earlier job of the same name is not ours to count."""
        return [p for p in self.pods.of(key) if p.owner_uid == uid]

    def owned_service(self, key: JobKey, uid: str, name: str) -> ServiceView | None:
        """The Service of that name that names this job as its controller (whether the operator made it is
        planner/ownership.py's to say); another of the job's labels and owner is not its rendezvous Service."""
        return next((s for s in self.services.of(key) if s.owner_uid == uid and s.name == name), None)

    def endpoint_slices(self, namespace: str, service: str) -> tuple[SliceView, ...]:
        """Every EndpointSlice that joins the job's Service `service`, the operator's own among them: kept by the
        job its name says (for a job whose name was cut to fit a renamed Service's, a prefix of it)."""
        job = naming.job_of_rendezvous_service(service) or ""
        return tuple(s for s in self.slices.of(naming.job_key(namespace, job)) if s.service == service)

    def leftovers(self, key: JobKey, uid: str) -> list[Leftover]:
        """Pods and Services under this job's name controlled by another job (a pod already being deleted is
        on its way out)."""
        found = [Leftover("Pod", p.name, p.uid, p.owner_uid) for p in self.pods.of(key)
                 if p.owner_uid not in (None, uid) and not p.deleting]
        return found + [Leftover("Service", s.name, s.uid, s.owner_uid) for s in self.services.of(key)
                        if s.owner_uid not in (None, uid)]
