"""List, then watch from the list's resourceVersion: the objects the operator owns, selected by label on the server.

The official client is synchronous, so each watch stream is read in a thread of its own and its events are
handed to the event loop. Raw JSON is decoded once; no client models are built (at fleet size that
deserialization was most of the operator's CPU).

Recovery: a watch that ends (server timeout, a broken connection) resumes from the last resourceVersion, which
bookmarks keep fresh, so nothing is missed. When the API server no longer has that version (410 Gone: it
restarted, or the gap was long), the reflector lists again and the list replaces what the mirror held:
objects deleted meanwhile disappear, and their jobs are woken.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

from elasticjob import k8s

LIST_PAGE = 500
WATCH_SECONDS = 300  # the server ends each watch after this; it resumes from the last resourceVersion
BACKOFF_SECONDS = (0.5, 1, 2, 5, 10)
LIST_THREADS = 2  # beside the one thread each watch holds: lists after a gap

OnList = Callable[[str | None, list[dict[str, Any]]], None]
OnEvent = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Source:
    """What to list and watch: a resource, optionally one namespace, optionally a label selector.
    `list_fn` is the client's list call for that namespace (or all), taking only keyword arguments."""

    kind: str
    namespace: str | None
    label_selector: str | None
    list_fn: Callable[..., Any]


class Reflector:
    def __init__(self, source: Source, on_list: OnList, on_event: OnEvent, executor: ThreadPoolExecutor,
                 logger: logging.Logger):
        self.source, self._on_list, self._on_event = source, on_list, on_event
        self._executor, self._log = executor, logger
        self.lists = 0  # how often it listed: the first, then after every gap
        self.synced = asyncio.Event()  # set after the first complete list
        self.last_contact = time.monotonic()
        self.version: str | None = None  # where the watch resumes; None: list first
        self._response: Any = None

    @property
    def where(self) -> str:
        return f"{self.source.kind} in {self.source.namespace}" if self.source.namespace else self.source.kind

    async def run(self) -> None:
        """List, then watch for ever. A broken watch resumes from the last resourceVersion; only a 410 Gone
        (the API server no longer has that version: after its restart, or a long gap) lists again."""
        failures = 0
        while True:
            try:
                if self.version is None:
                    self.version = await self._list()
                while True:
                    self.version = await self._watch(self.version)
                    failures = 0
            except k8s.Gone:
                self._log.info(f"watch of {self.where} expired (410 Gone): listing again")
                self.version = None
            except asyncio.CancelledError:
                self.stop()
                raise
            except Exception as exc:  # a broken stream or an unreachable API server: try again, after a pause
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                self._log.warning(f"watch of {self.where} failed ({describe(exc)}); again in {delay}s")
                await asyncio.sleep(delay)

    def silent_for(self) -> float:
        return time.monotonic() - self.last_contact

    def stop(self) -> None:
        response = self._response
        if response is not None:
            shut(response)  # unblocks the reading thread

    async def _list(self) -> str:
        items, version = await asyncio.get_running_loop().run_in_executor(self._executor, self._list_all)
        self._on_list(self.source.namespace, items)
        self.lists += 1
        self.last_contact = time.monotonic()
        self.synced.set()
        return version

    def _list_all(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = orjson.loads(self._call(limit=LIST_PAGE, _continue=token).data)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, page["metadata"]["resourceVersion"]

    def _call(self, **params: Any) -> Any:
        source = self.source
        if source.label_selector:
            params["label_selector"] = source.label_selector
        try:
            return source.list_fn(_preload_content=False, **{k: v for k, v in params.items() if v})
        except ApiException as exc:
            raise k8s.translate(exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise k8s.Unavailable(0, "Unavailable", f"no answer from the API server: {exc}") from None

    async def _watch(self, version: str) -> str:
        """One watch request; returns the resourceVersion to resume from."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        ended = threading.Event()

        def pump() -> None:
            try:
                for event in self._stream(version, ended):
                    loop.call_soon_threadsafe(events.put_nowait, event)
            except BaseException as exc:  # handed over to the loop, raised there
                loop.call_soon_threadsafe(events.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(events.put_nowait, done)

        reader = loop.run_in_executor(self._executor, pump)
        try:
            while (event := await events.get()) is not done:
                if isinstance(event, BaseException):
                    raise event
                version = self._handle(event, version)
        finally:
            ended.set()
            self.stop()
            await asyncio.shield(reader)
        return version

    def _stream(self, version: str, ended: threading.Event) -> Iterator[dict[str, Any]]:
        response = self._call(watch=True, resource_version=version, allow_watch_bookmarks=True,
                              timeout_seconds=WATCH_SECONDS, _request_timeout=(10, WATCH_SECONDS + 30))
        self._response = response
        if ended.is_set():
            # Stopped while the request was on its way, so stop() found nothing to shut: without this the
            # operator's shutdown waited for the watch's own timeout (minutes) and was SIGKILLed.
            shut(response)
        try:
            for line in response:
                if line.strip():
                    yield orjson.loads(line)
        finally:
            self._response = None
            response.release_conn()

    def _handle(self, event: dict[str, Any], version: str) -> str:
        self.last_contact = time.monotonic()
        kind, body = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            error = k8s.Gone if body.get("code") == 410 else k8s.KubeError
            raise error(body.get("code") or 0, body.get("reason") or "", body.get("message") or "")
        version = (body.get("metadata") or {}).get("resourceVersion") or version
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._on_event(kind, body)
        return version


def shut(response: Any) -> None:
    try:
        response.shutdown()
    except OSError:  # shut already, by the other side of the race
        pass


def describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def watch_threads(sources: int) -> ThreadPoolExecutor:
    """A thread per stream, plus a few for lists: a watch holds its thread for minutes."""
    return ThreadPoolExecutor(sources + LIST_THREADS, "watch")

