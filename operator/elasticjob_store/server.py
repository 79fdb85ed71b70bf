"""The store's control endpoint on port + 1: the operator reads the rendezvous and nudges it, over HTTP only.

Every request but GET /healthz needs `Authorization: Bearer <token>`, checked as auth.Credential says (the pod
holds the token's digest; with no token configured every control request is refused). The HTTP shell and the
checks on each request are wire.py's; here are the routes, on the Control of this store.
"""

from __future__ import annotations

import secrets
from http import HTTPStatus
from typing import Any

from elasticjob_store import wire
from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.control import ConflictError, Control, wait_for_change
from elasticjob_store.report import describe, node_ref
from elasticjob_store.state import StateError

ERRORS: tuple[wire.ErrorAnswer, ...] = (
    (StateError, HTTPStatus.INTERNAL_SERVER_ERROR, "rendezvous state refused: "),
    (ConflictError, HTTPStatus.CONFLICT, ""),
    (RuntimeError, HTTPStatus.SERVICE_UNAVAILABLE, "store: "),  # the TCPStore client's errors
)


def make_server(control: Control, host: str, port: int, credential: Credential) -> CappedHTTPServer:
    epoch = secrets.token_hex(8)  # per process start: tells the operator that counts and history restarted

    def state_view(_body: Any, query: wire.Query) -> dict[str, Any]:
        """With ?after=N&epoch=E&wait=S: answered once the summary's version passes N (or the epoch is not E,
        i.e. this store restarted), or after S seconds: a long-poll, so the operator learns of a failure
        round or a stale heartbeat within the poller's tick without polling every store."""
        after, wait = wire.query_int(query, "after", -1), wire.query_float(query, "wait", 0.0)
        if query.get("epoch", [epoch])[0] == epoch and wait > 0:
            wait_for_change(control, after, wait)
        _, state = control.read()
        with control.lock:
            return describe(state, control.tracker, now=control.now(), epoch=epoch, run_id=control.run_id,
                            min_nodes=control.min_nodes, max_nodes=control.max_nodes, version=control.version,
                            stale_after=control.stale_after, torch=control.torch_report())

    def remove(body: Any, _query: wire.Query) -> dict[str, Any]:
        args = wire.fields(body, {"addr": wire.ip, "heartbeatBefore": wire.unix_time})
        outcome = control.remove(args["addr"], args["heartbeatBefore"])
        return {"removed": [node_ref(node) for node in outcome.nodes], "changed": outcome.state is not None,
                "refused": outcome.reason if outcome.refused else None, "reason": outcome.reason}

    def complete(body: Any, _query: wire.Query) -> dict[str, Any]:
        args = wire.fields(body, {"liveNodes": wire.integer(1, wire.MAX_INT)})
        outcome = control.complete(args["liveNodes"])
        return {"completed": outcome.done, "changed": outcome.state is not None, "reason": outcome.reason}

    def restart(body: Any, _query: wire.Query) -> dict[str, Any]:
        args = wire.fields(body, {"round": wire.integer(0, wire.MAX_INT)})
        outcome = control.restart(args["round"])
        return {"restarting": outcome.done, "changed": outcome.state is not None, "reason": outcome.reason}

    routes: dict[tuple[str, str], wire.Route] = {
        ("GET", "/v1/state"): state_view,
        ("POST", "/v1/remove"): remove,
        ("POST", "/v1/complete"): complete,
        ("POST", "/v1/restart"): restart,
    }
    return wire.make_server(routes, host, port, credential, ERRORS,
                            log=lambda line: control.log(f"refusing the stored state: {line}"))
