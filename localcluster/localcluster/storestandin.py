"""A light stand-in for the rendezvous store, for benchmarks whose workers never rendezvous (sleep containers).

    python -m localcluster.storestandin      # what a container of image `elasticjob-store-standin` runs here

The real store (`python -m elasticjob_store`) serves without torch but checks its torch in a child process
(elasticjob_store/compat.py): about 2 s and 300 MB per store pod, which at fleet size is most of this 2-core
machine. This program has the same outside: it listens on ELASTICJOB_RDZV_PORT (so
the pod's tcpSocket readiness probe passes) and serves the control endpoint on the next port exactly as
operator/elasticjob_store/server.py does for a store no agent has written to yet: GET /healthz without a token;
GET /v1/state with the bearer token (checked by elasticjob_store.auth against ELASTICJOB_RDZV_TOKEN_SHA256), a
long-poll with ?after=&epoch=&wait= (answered at once when the epoch is not this process's or the version
passed `after`, else after `wait` seconds, at most 60); POST /v1/remove|complete|restart answer "nothing
changed". The epoch is random per process start and the version stays 0: nothing ever changes here.
Standard library only (about 0.1 s to start, 15 MB).

Jobs opt in with `spec.rendezvous.image: elasticjob-store-standin`; the node agent maps that image to this
program (images.py). Not for jobs whose workers run torchrun: the c10d port accepts and closes connections.
The HTTP shell and every check on a request are the real store's own (elasticjob_store/wire.py).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import threading
import time
from typing import Any

from elasticjob_store import protocol, wire
from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer

PROGRAM = "elasticjob rendezvous stand-in"
IMAGE = "elasticjob-store-standin"


def state_body(epoch: str, run_id: str, min_nodes: int, max_nodes: int) -> dict[str, Any]:
    """What elasticjob_store.report.describe returns for a store no agent has written to yet."""
    return {"epoch": epoch, "version": 0, "runId": run_id, "now": time.time(), "minNodes": min_nodes,
            "maxNodes": max_nodes, "staleAfter": 1e9, "round": None, "complete": False, "closed": False,
            "deadlineIn": None, "participants": [], "waiting": [], "redundant": [], "failureRounds": 0,
            "lastFailureRoundAt": None, "rounds": [], "waiterActive": False}


def make_server(host: str, port: int, credential: Credential, run_id: str = "", min_nodes: int = 1,
                max_nodes: int = 1, epoch: str | None = None) -> CappedHTTPServer:
    epoch = epoch or secrets.token_hex(8)
    version = 0
    stop = threading.Event()

    def state_view(_body: Any, query: wire.Query) -> dict[str, Any]:
        asked = protocol.StateQuery.from_query(query)
        if asked.holds(epoch) and asked.after >= version:
            stop.wait(asked.wait)  # nothing changes here: the long-poll runs its full course
        return state_body(epoch, run_id, min_nodes, max_nodes)

    def unchanged(_body: Any, _query: wire.Query) -> dict[str, Any]:
        return protocol.ActionReply(False, "stand-in store: no rendezvous here").to_wire()

    routes: dict[tuple[str, str], wire.Route] = {("GET", protocol.STATE): state_view,
                                                  **{("POST", path): unchanged for path in protocol.ACTIONS}}
    server = wire.make_server(routes, host, port, credential, name="elasticjob-rendezvous-standin")
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
    wire.listen_or_exit(PROGRAM, port, lambda: accept_and_close(port))
    control = protocol.control_port(port)
    server = wire.listen_or_exit(PROGRAM, control, lambda: make_server(
        "", control, Credential.from_env(), os.environ.get("ELASTICJOB_RDZV_RUN_ID", ""), min_nodes, max_nodes))
    threading.Thread(target=server.serve_forever, name="control-http", daemon=True).start()
    print(f"elasticjob rendezvous stand-in listening on port {port}, control on {control}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print("elasticjob rendezvous stand-in stopping", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
