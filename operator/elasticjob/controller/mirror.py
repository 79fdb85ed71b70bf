"""What the operator knows of the cluster: its jobs, the pods and Services labelled with a job's name, and the
EndpointSlices that name a job's rendezvous Service. Pure.

Watches feed it one event at a time; a (re)list replaces everything it held for that namespace, so an object
deleted while no watch ran (an API server restart, a 410 Gone, an operator restart) leaves the mirror with the
next list. kopf's indexes never drop an object without a DELETED event; that is why this exists.

Every change reports the job keys it touched, so that exactly those jobs are woken. Updates that change nothing
the planner looks at (a new resourceVersion, a kubelet heartbeat) wake no one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from elasticjob import naming
from elasticjob.kueue.workloads import FlavorView, WorkloadView, observe_flavor, observe_workload, same_to_plan
from elasticjob.observe import PodView, ServiceView, SliceView, observe_pod, observe_service, observe_slice
from elasticjob.planner import Leftover

JobKey = tuple[str, str]
GONE_KEPT = 10000
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Entry(Generic[V]):
    key: JobKey
    view: V


# From a raw object to (its uid, the entry), or None when it is none of ours (no job label).
Convert = Callable[[Mapping[str, Any]], "tuple[str, Entry[V]] | None"]


class KindCache(Generic[V]):
    """One kind of object, by uid, grouped by the job it belongs to (not the rendezvous store)."""

    def __init__(self, convert: Convert[V], same: Callable[[V, V], bool] | None = None):
        self._convert = convert
        self._same = same or (lambda a, b: a == b)
        self._by_uid: dict[str, Entry[V]] = {}
        self._by_job: dict[JobKey, dict[str, V]] = {}
        self._gone: dict[str, None] = {}  # uids seen deleted, newest last: a late create reply must not revive them

    def __len__(self) -> int:
        return len(self._by_uid)

    def of(self, key: JobKey) -> list[V]:
        return list(self._by_job.get(key, {}).values())

    def keys(self) -> set[JobKey]:
        return set(self._by_job)

    def any_in(self, namespace: str) -> bool:
        return any(key[0] == namespace for key in self._by_job)

    def apply(self, kind: str, body: Mapping[str, Any]) -> set[JobKey]:
        """One watch event (ADDED, MODIFIED, DELETED); returns the jobs it touched."""
        converted = self._convert(body)
        if converted is None:
            return set()
        uid, entry = converted
        if kind == "DELETED":
            return self._drop(uid)
        return self._put(uid, entry)

    def replace(self, namespace: str | None, bodies: Iterable[Mapping[str, Any]]) -> set[JobKey]:
        """A complete list of one namespace (None: all of them): what it lacks is gone."""
        fresh: dict[str, Entry[V]] = {}
        for body in bodies:
            if (converted := self._convert(body)) is not None:
                fresh[converted[0]] = converted[1]
        touched: set[JobKey] = set()
        for uid, entry in list(self._by_uid.items()):
            if (namespace is None or entry.key[0] == namespace) and uid not in fresh:
                touched |= self._drop(uid)
        for uid, entry in fresh.items():
            touched |= self._put(uid, entry)
        return touched

    def add_created(self, body: Mapping[str, Any]) -> bool:
        """An object this operator just created, as the API server's reply holds it: known at once, so that the
        next plan neither waits for the watch nor creates it again. Never over anything the watch delivered
        (that is as new or newer); the watch's own events then replace it. True when it was added."""
        converted = self._convert(body)
        if converted is None or converted[0] in self._by_uid or converted[0] in self._gone:
            return False
        self._put(*converted)
        return True

    def _put(self, uid: str, entry: Entry[V]) -> set[JobKey]:
        """Keeps the newest view; wakes the job only when it changed in what the planner looks at."""
        old = self._by_uid.get(uid)
        same = old is not None and old.key == entry.key and self._same(old.view, entry.view)
        touched = self._drop(uid) if old is not None and old.key != entry.key else set()
        self._by_uid[uid] = entry
        self._by_job.setdefault(entry.key, {})[uid] = entry.view
        return set() if same else touched | {entry.key}

    def _drop(self, uid: str) -> set[JobKey]:
        self._gone[uid] = None
        if len(self._gone) > GONE_KEPT:
            del self._gone[next(iter(self._gone))]
        entry = self._by_uid.pop(uid, None)
        if entry is None:
            return set()
        group = self._by_job.get(entry.key, {})
        group.pop(uid, None)
        if not group:
            self._by_job.pop(entry.key, None)
        return {entry.key}


def _labelled(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], JobKey] | None:
    meta = body.get("metadata") or {}
    job = (meta.get("labels") or {}).get(naming.JOB_LABEL)
    if not job or not meta.get("uid"):
        return None
    return meta, naming.job_key(meta.get("namespace", ""), job)


def _pod(body: Mapping[str, Any]) -> tuple[str, Entry[PodView]] | None:
    if (found := _labelled(body)) is None:
        return None
    meta, key = found
    return meta["uid"], Entry(key, observe_pod(body))


def _service(body: Mapping[str, Any]) -> tuple[str, Entry[ServiceView]] | None:
    if (found := _labelled(body)) is None:
        return None
    meta, key = found
    return meta["uid"], Entry(key, observe_service(body))


def _slice(body: Mapping[str, Any]) -> tuple[str, Entry[SliceView]] | None:
    """Any EndpointSlice whose Service name is a job's rendezvous Service's, whoever made it and whatever its other
    labels (one that joins the Service need carry no job label): by the job that name belongs to, whose loop its
    changes wake."""
    meta = body.get("metadata") or {}
    service = (meta.get("labels") or {}).get(naming.SERVICE_NAME_LABEL) or ""
    job = naming.job_of_rendezvous_service(service)
    if job is None or not meta.get("uid"):
        return None
    return meta["uid"], Entry(naming.job_key(meta.get("namespace", ""), job), observe_slice(body))


def _workload(body: Mapping[str, Any]) -> tuple[str, Entry[WorkloadView]] | None:
    if (found := _labelled(body)) is None:
        return None
    meta, key = found
    return meta["uid"], Entry(key, observe_workload(body))


class Flavors:
    """Kueue's ResourceFlavors by name (cluster-scoped, no job's): their node labels go on admitted pods."""

    def __init__(self) -> None:
        self.by_name: dict[str, FlavorView] = {}

    def __len__(self) -> int:
        return len(self.by_name)

    def apply(self, kind: str, body: Mapping[str, Any]) -> set[JobKey]:
        view = observe_flavor(body)
        if kind == "DELETED":
            self.by_name.pop(view.name, None)
        else:
            self.by_name[view.name] = view
        return set()  # a job waiting for a flavor it was assigned looks again within seconds

    def replace(self, namespace: str | None, bodies: Iterable[Mapping[str, Any]]) -> set[JobKey]:
        self.by_name = {view.name: view for view in map(observe_flavor, bodies)}
        return set()


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
        body: dict[str, Any] = json.loads(self.raw)
        return body


def _job(body: Mapping[str, Any]) -> tuple[str, Entry[StoredJob]] | None:
    meta = body.get("metadata") or {}
    if not meta.get("uid") or not meta.get("name"):
        return None
    raw = json.dumps(without_managed_fields(body), separators=(",", ":")).encode()
    stored = StoredJob(meta.get("resourceVersion") or "", meta.get("creationTimestamp") or "", raw)
    return meta["uid"], Entry(naming.job_key(meta.get("namespace", ""), meta["name"]), stored)


def _same_version(a: StoredJob, b: StoredJob) -> bool:
    return a.resource_version == b.resource_version


class Mirror:
    """Jobs (whole bodies, kept as JSON: the planner needs the spec), their pods, Services and the EndpointSlices
    of their rendezvous Services (views: what it decides on)."""

    def __init__(self) -> None:
        self.jobs: KindCache[StoredJob] = KindCache(_job, _same_version)
        self.pods: KindCache[PodView] = KindCache(_pod)
        self.services: KindCache[ServiceView] = KindCache(_service)
        self.slices: KindCache[SliceView] = KindCache(_slice)
        self.workloads: KindCache[WorkloadView] = KindCache(_workload, same_to_plan)
        self.flavors = Flavors()

    def cache(self, kind: str) -> KindCache[Any] | Flavors:
        caches: dict[str, KindCache[Any] | Flavors] = {
            "elasticjobs": self.jobs, "pods": self.pods, "services": self.services, "endpointslices": self.slices,
            "workloads": self.workloads,
            "resourceflavors": self.flavors}
        return caches[kind]

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

    def owned_workloads(self, key: JobKey, uid: str) -> tuple[WorkloadView, ...]:
        """The job's Workloads: one, or its slices (kueue.current_slice picks the one that counts)."""
        return tuple(w for w in self.workloads.of(key) if w.owner_uid == uid)
