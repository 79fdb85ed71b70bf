"""The store's control endpoint on port + 1: the operator reads the rendezvous and nudges it, over HTTP only.

Every request but GET /healthz needs `Authorization: Bearer <token>`, checked as auth.Credential says (the pod
holds the token's digest; with no token configured every control request is refused). Standard library only:
the worker image this runs in has torch and nothing else.
"""

from __future__ import annotations

import ipaddress
import json
import math
import secrets
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.control import ConflictError, Control, wait_for_change
from elasticjob_store.report import describe, node_ref
from elasticjob_store.state import StateError

MAX_BODY = 4096
MAX_INT = 2**31 - 1
# Unix seconds up to the year 5138: enough for any heartbeat, small enough to stay a valid datetime.
MAX_UNIX = 1e11
# The longest a GET /v1/state?wait= holds its answer back (the operator asks for less, and times out later).
MAX_WAIT = 60.0


class BadRequest(ValueError):
    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def _fields(body: Any, required: dict[str, Callable[[str, Any], Any]]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(body) - set(required))
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    missing = sorted(set(required) - set(body))
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    return {name: check(name, body[name]) for name, check in required.items()}


def _int(low: int, high: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if type(value) is not int or not low <= value <= high:  # JSON true is not a count
            raise BadRequest(f"{name} must be an integer from {low} to {high}")
        return value
    return check


def _unix_time(name: str, value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_UNIX:
        raise BadRequest(f"{name} must be unix seconds (a number from 0 to {MAX_UNIX:.0f})")
    return float(value)


def _ip(name: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise BadRequest(f"{name} must be an IPv4 or IPv6 address")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise BadRequest(f"{name} must be an IPv4 or IPv6 address, not {value!r}") from None


def _query_int(query: dict[str, list[str]], name: str, default: int) -> int:
    value = query.get(name, [None])[0]
    if value is None:
        return default
    if not value.lstrip("-").isdigit() or not -1 <= int(value) <= MAX_INT:
        raise BadRequest(f"{name} must be an integer from -1 to {MAX_INT}")
    return int(value)


def _query_float(query: dict[str, list[str]], name: str, default: float) -> float:
    value = query.get(name, [None])[0]
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise BadRequest(f"{name} must be a number of seconds") from None
    if not math.isfinite(number) or not 0 <= number <= MAX_WAIT:
        raise BadRequest(f"{name} must be from 0 to {MAX_WAIT:.0f} seconds")
    return number


def make_server(control: Control, host: str, port: int, credential: Credential) -> CappedHTTPServer:
    epoch = secrets.token_hex(8)  # per process start: tells the operator that counts and history restarted

    def state_view(_body: Any, query: dict[str, list[str]]) -> dict[str, Any]:
        """With ?after=N&epoch=E&wait=S: answered once the summary's version passes N (or the epoch is not E,
        i.e. this store restarted), or after S seconds: a long-poll, so the operator learns of a failure
        round or a stale heartbeat within the poller's tick without polling every store."""
        after, wait = _query_int(query, "after", -1), _query_float(query, "wait", 0.0)
        if query.get("epoch", [epoch])[0] == epoch and wait > 0:
            wait_for_change(control, after, wait)
        _, state = control.read()
        with control.lock:
            return describe(state, control.tracker, now=control.now(), epoch=epoch, run_id=control.run_id,
                            min_nodes=control.min_nodes, max_nodes=control.max_nodes, version=control.version,
                            stale_after=control.stale_after, torch=control.torch_report())

    def remove(body: Any, _query: Any) -> dict[str, Any]:
        args = _fields(body, {"addr": _ip, "heartbeatBefore": _unix_time})
        outcome = control.remove(args["addr"], args["heartbeatBefore"])
        return {"removed": [node_ref(node) for node in outcome.nodes], "changed": outcome.state is not None,
                "refused": outcome.reason if outcome.refused else None, "reason": outcome.reason}

    def complete(body: Any, _query: Any) -> dict[str, Any]:
        args = _fields(body, {"liveNodes": _int(1, MAX_INT)})
        outcome = control.complete(args["liveNodes"])
        return {"completed": outcome.done, "changed": outcome.state is not None, "reason": outcome.reason}

    def restart(body: Any, _query: Any) -> dict[str, Any]:
        args = _fields(body, {"round": _int(0, MAX_INT)})
        outcome = control.restart(args["round"])
        return {"restarting": outcome.done, "changed": outcome.state is not None, "reason": outcome.reason}

    routes: dict[tuple[str, str], Callable[[Any, dict[str, list[str]]], dict[str, Any]]] = {
        ("GET", "/v1/state"): state_view,
        ("POST", "/v1/remove"): remove,
        ("POST", "/v1/complete"): complete,
        ("POST", "/v1/restart"): restart,
    }

    class Handler(BaseHTTPRequestHandler):
        # A client that stops sending mid-request frees its thread after this long.
        timeout = 10
        server_version = "elasticjob-rendezvous"
        sys_version = ""

        def do_GET(self) -> None:
            if self.path == "/healthz":  # the liveness probe: no token, no store access
                self._send(HTTPStatus.OK, b"ok", "text/plain")
                return
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            if not self._authorized():
                self._json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"},
                           {"WWW-Authenticate": 'Bearer realm="elasticjob-rendezvous"'})
                return
            url = urlsplit(self.path)
            route = routes.get((method, url.path))
            if route is None:
                known = any(path == url.path for _, path in routes)
                status = HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND
                self._json(status, {"error": f"no {method} {url.path}"})
                return
            try:
                body = self._body() if method == "POST" else None
                self._json(HTTPStatus.OK, route(body, parse_qs(url.query)))
            except BadRequest as err:
                self._json(err.status, {"error": str(err)})
            except StateError as err:
                control.log(f"refusing the stored state: {err}")
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"rendezvous state refused: {err}"})
            except ConflictError as err:
                self._json(HTTPStatus.CONFLICT, {"error": str(err)})
            except RuntimeError as err:  # the TCPStore client's errors
                self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"store: {err}"})

        def _authorized(self) -> bool:
            return credential.accepts(self.headers.get("Authorization", ""))

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

        def _json(self, status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(body).encode(), "application/json", headers)

        def _send(self, status: HTTPStatus, data: bytes, content_type: str,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown the action lines; actions log themselves

    return CappedHTTPServer((host, port), Handler)
