"""The control endpoint's HTTP shell: bearer token, routes, JSON bodies and the status codes, written once.
What each request and reply holds, and the checks on a request's fields, are protocol.py's. Standard library
only (no torch), so that the local cluster's stand-in store (localcluster/storestandin.py) answers on the same
wire as the real one (server.py). Named wire, not http: run from inside this folder, a module named http would
stand in for the standard library's.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qs, urlsplit

from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.protocol import HEALTHZ, ErrorReply, Invalid

MAX_BODY = 4096
# A request (its line, headers and body) must be in within this long of the connection: a client that sends a
# byte every few seconds would otherwise hold its slot for ever, one receive timeout at a time.
REQUEST_DEADLINE = 5.0

T = TypeVar("T")
Query = dict[str, list[str]]  # as parse_qs makes it
Route = Callable[[Any, Query], Mapping[str, Any]]  # a reply: a dict, or a TypedDict of protocol_state
# An error a route may raise, the status it answers with, and the prefix of its message.
ErrorAnswer = tuple[type[BaseException], HTTPStatus, str]


class BadRequest(Invalid):
    """A request the shell refuses before any route reads it (its length, its JSON), with its status."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def make_server(routes: dict[tuple[str, str], Route], host: str, port: int, credential: Credential,
                errors: Sequence[ErrorAnswer] = (), name: str = "elasticjob-rendezvous",
                log: Callable[[str], None] | None = None) -> CappedHTTPServer:
    """Serves `routes` ((method, path) -> route(body, query) -> JSON) behind the bearer token. A route's
    protocol.Invalid (a body or query that is not the protocol's) answers 400, a BadRequest with its status;
    the `errors` with theirs, in order (the first that matches)."""

    class Handler(BaseHTTPRequestHandler):
        # A client that stops sending mid-request frees its thread after this long (REQUEST_DEADLINE in all).
        timeout = 10
        server_version = name
        sys_version = ""
        deadline: threading.Timer

        def setup(self) -> None:
            super().setup()
            self.deadline = threading.Timer(REQUEST_DEADLINE, self._too_slow)
            self.deadline.daemon = True
            self.deadline.start()

        def _too_slow(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns; the thread ends
            except OSError:
                pass

        def finish(self) -> None:
            self.deadline.cancel()
            super().finish()

        def do_GET(self) -> None:
            self.deadline.cancel()  # the request is in; a long-poll may now wait as long as it asked
            if self.path == HEALTHZ:  # the liveness probe: no token, no store access
                self._send(HTTPStatus.OK, b"ok", "text/plain")
                return
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            if not credential.accepts(self.headers.get("Authorization", "")):
                self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token",
                            {"WWW-Authenticate": 'Bearer realm="elasticjob-rendezvous"'})
                return
            url = urlsplit(self.path)
            route = routes.get((method, url.path))
            if route is None:
                known = any(path == url.path for _, path in routes)
                status = HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND
                self._error(status, f"no {method} {url.path}")
                return
            try:
                body = self._body() if method == "POST" else None
                self.deadline.cancel()
                self._json(HTTPStatus.OK, route(body, parse_qs(url.query)))
            except Invalid as err:
                self._error(err.status if isinstance(err, BadRequest) else HTTPStatus.BAD_REQUEST, str(err))
            except Exception as err:
                answer = next(((status, prefix) for kind, status, prefix in errors if isinstance(err, kind)), None)
                if answer is None:
                    raise
                if log is not None and answer[0] == HTTPStatus.INTERNAL_SERVER_ERROR:
                    log(str(err))
                self._error(answer[0], f"{answer[1]}{err}")

        def _body(self) -> Any:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise BadRequest("Content-Length is required", HTTPStatus.LENGTH_REQUIRED)
            if int(length) > MAX_BODY:
                self.close_connection = True  # the unread body must not be parsed as the next request
                raise BadRequest(f"the body is larger than {MAX_BODY} bytes", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            try:
                return json.loads(self.rfile.read(int(length)))
            except (ValueError, UnicodeDecodeError) as err:
                raise BadRequest(f"the body is not JSON: {err}") from None

        def _json(self, status: HTTPStatus, body: Mapping[str, Any], headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(body).encode(), "application/json", headers)

        def _error(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
            self._json(status, ErrorReply(message).to_wire(), headers)

        def _send(self, status: HTTPStatus, data: bytes, content_type: str,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for header, value in (headers or {}).items():
                self.send_header(header, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown the action lines; actions log themselves

    return CappedHTTPServer((host, port), Handler)


def listen_or_exit(program: str, port: int, bind: Callable[[], T]) -> T:
    """Returns what `bind` made, or exits 1 with one line naming the port: a port taken on the pod's network is
    for whoever runs the pod to fix, and a traceback hides which port it was."""
    try:
        return bind()
    except (OSError, RuntimeError) as err:  # RuntimeError: torch's DistNetworkError for the store's own port
        _cannot_listen(program, port, err)


def _cannot_listen(program: str, port: int, err: BaseException) -> NoReturn:
    print(f"{program}: cannot listen on port {port}: {err}", file=sys.stderr, flush=True)
    sys.exit(1)
