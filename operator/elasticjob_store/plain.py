"""The control endpoint when this torch lacks a name the state decoder imports (compat.py): no nudges, no
reading of torch's state; GET /v1/state says why and GET /healthz keeps the pod ready. Same bearer token, same
wire (wire.py)."""

from __future__ import annotations

import secrets
import time
from http import HTTPStatus
from typing import Any

from elasticjob_store import protocol, wire
from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.compat import Verdict


class NudgesOff(RuntimeError):
    pass


def make_plain_server(verdict: Verdict, host: str, port: int, credential: Credential) -> CappedHTTPServer:
    body = {"epoch": secrets.token_hex(8), "version": 0, "round": None, "torch": verdict.report()}

    def state_view(_body: Any, query: wire.Query) -> dict[str, Any]:
        # Nothing here ever changes: a long-poll is held as long as asked (capped), never spun on.
        time.sleep(protocol.StateQuery.from_query(query).wait)
        return body

    def refuse(_body: Any, _query: wire.Query) -> dict[str, Any]:
        raise NudgesOff(verdict.why)

    routes: dict[tuple[str, str], wire.Route] = {("GET", protocol.STATE): state_view,
                                                  **{("POST", path): refuse for path in protocol.ACTIONS}}
    return wire.make_server(routes, host, port, credential, ((NudgesOff, HTTPStatus.CONFLICT, "nudges are off: "),))
