"""A cache of one kind of object, by uid and grouped by the job it belongs to, fed by a watch (the controller's
mirror holds one per kind; an integration brings its own, elasticjob/integrations.py). Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from elasticjob import naming

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


def labelled(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], JobKey] | None:
    meta = body.get("metadata") or {}
    job = (meta.get("labels") or {}).get(naming.JOB_LABEL)
    if not job or not meta.get("uid"):
        return None
    return meta, naming.job_key(meta.get("namespace", ""), job)




class Cache(Protocol):
    """What a watch feeds: one event, or a complete list of a namespace (None: of all); the jobs it touched."""

    def __len__(self) -> int: ...

    def apply(self, kind: str, body: Mapping[str, Any]) -> set[JobKey]: ...

    def replace(self, namespace: str | None, bodies: Iterable[Mapping[str, Any]]) -> set[JobKey]: ...


@dataclass(frozen=True)
class Watched:
    """A resource an integration has the controller list and watch into its cache: by `kind` (the cache's key),
    in each watched namespace or cluster-wide, optionally by label."""

    kind: str
    api_version: str
    plural: str
    namespaced: bool = True
    label_selector: str | None = None
