"""Polling with a deadline: the only way tests here wait for the cluster."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

T = TypeVar("T")

_UNSEEN = object()
# Lines that mean the operator hit an error it did not handle (its log, as a process or as a pod).
OPERATOR_LOG_FAILURES = re.compile(r"Traceback \(most recent call last\)|\bunhandled\b", re.IGNORECASE)


def wait_for(
    observe: Callable[[], T],
    timeout: float,
    what: str,
    *,
    until: Callable[[T], Any] = bool,
    interval: float = 0.2,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Calls `observe` until `until(value)` holds and returns that value.

    On timeout raises AssertionError naming `what` and the last value seen, so a failure says what the
    cluster looked like. Exceptions of the `ignore` types count as an observation (e.g. a 404 while an
    object does not exist yet); any other exception propagates at once.
    """
    deadline = time.monotonic() + timeout
    last: Any = _UNSEEN
    while True:
        try:
            last = observe()
            if until(last):
                return last
        except ignore as err:
            last = err
        if time.monotonic() >= deadline:
            seen = "nothing (never observed)" if last is _UNSEEN else repr(last)
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last observed: {seen}")
        time.sleep(interval)


async def until(predicate: Callable[[], Any], timeout: float, what: str = "a condition",
                interval: float = 0.01) -> None:
    """wait_for's twin inside an event loop: polls `predicate` without blocking the loop."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(interval)


@contextlib.contextmanager
def json_server(answer: Callable[[str, dict[str, Any] | None], dict[str, Any]]) -> Iterator[str]:
    """A keep-alive HTTP server on 127.0.0.1 that answers every request with `answer(method, body sent)` as JSON
    (201 to a POST, 200 otherwise); yields its URL. For the API client's own behaviour, no cluster needed."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a connection serves many requests

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            sent = json.loads(self.rfile.read(length)) if length else None
            body = json.dumps(answer(self.command, sent)).encode()
            self.send_response(201 if self.command == "POST" else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

        def log_message(self, *_args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def api_refusal(change: Callable[[], object]) -> Exception | None:
    """What the API server answered `change` with, if it refused it (a kubernetes ApiException); None if it took
    it. For tests of admission policies, which expect some changes refused and others taken."""
    from kubernetes.client import ApiException

    try:
        change()
        return None
    except ApiException as exc:
        return exc
