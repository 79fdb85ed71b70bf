"""A light stand-in for the rendezvous store, for benchmarks whose workers never rendezvous (sleep containers).

    python -m localcluster.storestandin      # what a container of image `elasticjob-store-standin` runs here

The real store (`python -m elasticjob_store`) imports torch: about 2 s and 300 MB per store pod, which at fleet
size is most of this 2-core machine. This program has the same outside: it listens on ELASTICJOB_RDZV_PORT (so
the pod's tcpSocket readiness probe passes) and serves the control endpoint on port + 1 exactly as
operator/elasticjob_store/server.py does for a store no agent has written to yet: GET /healthz without a token;
GET /v1/state with the bearer token (checked by elasticjob_store.auth against ELASTICJOB_RDZV_TOKEN_SHA256), a
long-poll with ?after=&epoch=&wait= (answered at once when the epoch is not this process's or the version
passed `after`, else after `wait` seconds, at most 60); POST /v1/remove|complete|restart answer "nothing
changed". The epoch is random per process start and the version stays 0: nothing ever changes here.
Standard library only (about 0.1 s to start, 15 MB).

Jobs opt in with `spec.rendezvous.image: elasticjob-store-standin`; the node agent maps that image to this
program (images.py). Not for jobs whose workers run torchrun: the c10d port accepts and closes connections.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from elasticjob_store.auth import Credential

IMAGE = "elasticjob-store-standin"
MAX_WAIT = 60.0  # as elasticjob_store.server
ACTIONS = ("/v1/remove", "/v1/complete", "/v1/restart")


def state_body(epoch: str, run_id: str, min_nodes: int, max_nodes: int) -> dict[str, Any]:
    """What elasticjob_store.report.describe returns for a store no agent has written to yet."""
    return {"epoch": epoch, "version": 0, "runId": run_id, "now": time.time(), "minNodes": min_nodes,
            "maxNodes": max_nodes, "staleAfter": 1e9, "round": None, "complete": False, "closed": False,
            "deadlineIn": None, "participants": [], "waiting": [], "redundant": [], "failureRounds": 0,
            "lastFailureRoundAt": None, "rounds": [], "waiterActive": False}


def _number(query: dict[str, list[str]], name: str, default: float, low: float, high: float) -> float:
    value = query.get(name, [None])[0]
    if value is None:
        return default
    number = float(value)  # ValueError: 400
    if not low <= number <= high:
        raise ValueError(f"{name} must be from {low:g} to {high:g}")
    return number


def make_server(host: str, port: int, credential: Credential, run_id: str = "", min_nodes: int = 1,
                max_nodes: int = 1, epoch: str | None = None) -> ThreadingHTTPServer:
    epoch = epoch or secrets.token_hex(8)
    version = 0
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        timeout = 10
        server_version = "elasticjob-rendezvous-standin"
        sys_version = ""

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(HTTPStatus.OK, b"ok", "text/plain")
            elif self._authorized():
                url = urlsplit(self.path)
                if url.path != "/v1/state":
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no GET {url.path}"})
                    return
                query = parse_qs(url.query)
                try:
                    after = _number(query, "after", -1, -1, 2**31 - 1)
                    wait = _number(query, "wait", 0.0, 0.0, MAX_WAIT)
                except ValueError as err:
                    self._json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
                    return
                if query.get("epoch", [epoch])[0] == epoch and after >= version and wait > 0:
                    stop.wait(wait)  # nothing changes here: the long-poll runs its full course
                self._json(HTTPStatus.OK, state_body(epoch, run_id, min_nodes, max_nodes))

        def do_POST(self) -> None:
            if not self._authorized():
                return
            path = urlsplit(self.path).path
            if path not in ACTIONS:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no POST {path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(min(length, 4096))
            self._json(HTTPStatus.OK, {"changed": False, "reason": "stand-in store: no rendezvous here"})

        def _authorized(self) -> bool:
            if credential.accepts(self.headers.get("Authorization", "")):
                return True
            self._json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
            return False

        def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: HTTPStatus, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.epoch = epoch  # type: ignore[attr-defined]
    return server


def accept_and_close(port: int) -> threading.Thread:
    """The c10d port: accepts (a tcpSocket probe passes) and closes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", port))
    sock.listen(64)

    def run() -> None:
        while True:
            conn, _ = sock.accept()
            conn.close()

    thread = threading.Thread(target=run, name="c10d-standin", daemon=True)
    thread.start()
    return thread


def main() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    port = int(os.environ.get("ELASTICJOB_RDZV_PORT", "29400"))
    min_nodes = int(os.environ.get("ELASTICJOB_RDZV_MIN_NODES") or 1)
    max_nodes = int(os.environ.get("ELASTICJOB_RDZV_MAX_NODES") or min_nodes)
    accept_and_close(port)
    server = make_server("", port + 1, Credential.from_env(), os.environ.get("ELASTICJOB_RDZV_RUN_ID", ""), min_nodes,
                         max_nodes)
    threading.Thread(target=server.serve_forever, name="control-http", daemon=True).start()
    print(f"elasticjob rendezvous stand-in listening on port {port}, control on {port + 1}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print("elasticjob rendezvous stand-in stopping", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
