"""The control endpoint when this torch lacks a name the state decoder imports (compat.py): no nudges, no
reading of torch's state; GET /v1/state says why and GET /healthz keeps the pod ready. Same bearer token."""

from __future__ import annotations

import json
import secrets
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.compat import Verdict

MAX_WAIT = 60.0


def _wait(query: dict[str, list[str]]) -> float:
    try:
        seconds = float(query.get("wait", ["0"])[0])
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_WAIT) if seconds == seconds else 0.0


def make_plain_server(verdict: Verdict, host: str, port: int, credential: Credential) -> CappedHTTPServer:
    body = json.dumps({"epoch": secrets.token_hex(8), "version": 0, "round": None, "torch": verdict.report()})

    class Handler(BaseHTTPRequestHandler):
        timeout = 10
        server_version = "elasticjob-rendezvous"
        sys_version = ""

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(HTTPStatus.OK, "ok")
            elif not credential.accepts(self.headers.get("Authorization", "")):
                self._send(HTTPStatus.UNAUTHORIZED, json.dumps({"error": "missing or wrong bearer token"}))
            elif urlsplit(self.path).path == "/v1/state":
                # Nothing here ever changes: a long-poll is held as long as asked (capped), never spun on.
                time.sleep(_wait(parse_qs(urlsplit(self.path).query)))
                self._send(HTTPStatus.OK, body)
            else:
                self._send(HTTPStatus.NOT_FOUND, json.dumps({"error": f"no GET {self.path}"}))

        def do_POST(self) -> None:
            self.close_connection = True  # the body is not read
            self._send(HTTPStatus.CONFLICT, json.dumps({"error": f"nudges are off: {verdict.why}"}))

        def _send(self, status: HTTPStatus, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return CappedHTTPServer((host, port), Handler)
