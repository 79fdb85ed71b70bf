"""The control endpoint when this torch lacks a name the state decoder imports (compat.py): no nudges, no
reading of torch's state; GET /v1/state says why and GET /healthz keeps the pod ready. Same bearer token, same
wire (wire.py)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from elasticjob_store import protocol, wire
from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.compat import Verdict


class NudgesOff(RuntimeError):
    pass


def make_plain_server(verdict: Verdict, host: str, port: int, credential: Credential,
                      peers: Callable[[Any, wire.Query], dict[str, Any]] | None = None,
                      gate_report: Callable[[], dict[str, Any]] | None = None) -> CappedHTTPServer:
    """`peers` and `gate_report`: the gate's route and report (server.peers_route, gate.Gate.report), which
    serve here as in the full store: the gate must learn the job's pods whatever this torch is."""
    body = {"epoch": secrets.token_hex(8), "version": 0, "round": None, "torch": verdict.report()}

    def state_view(_body: Any, query: wire.Query) -> dict[str, Any]:
        # Nothing here changes but the gate's report: a long-poll is held as long as asked (capped), never spun on.
        time.sleep(protocol.StateQuery.from_query(query).wait)
        return {**body, "peers": gate_report()} if gate_report else body

    def refuse(_body: Any, _query: wire.Query) -> dict[str, Any]:
        raise NudgesOff(verdict.why)

    routes: dict[tuple[str, str], wire.Route] = {("GET", protocol.STATE): state_view,
                                                  **{("POST", path): refuse for path in protocol.ACTIONS}}
    if peers is not None:
        routes[("POST", protocol.path(protocol.Peers))] = peers
    return wire.make_server(routes, host, port, credential, ((NudgesOff, HTTPStatus.CONFLICT, "nudges are off: "),))
