"""The store's control endpoint (protocol.control_port): the operator reads the rendezvous and nudges it, over
HTTP only.

Every request but GET /healthz needs `Authorization: Bearer <token>`, checked as auth.Credential says (the pod
holds the token's digest; with no token configured every control request is refused). The HTTP shell and the
checks on each request are wire.py's, what each request and reply holds protocol.py's; here are the routes, on
the Control of this store.
"""

from __future__ import annotations

import secrets
from http import HTTPStatus
from typing import Any

from elasticjob_store import protocol, wire
from elasticjob_store.auth import Credential
from elasticjob_store.capped import CappedHTTPServer
from elasticjob_store.control import ConflictError, Control, wait_for_change
from elasticjob_store.gate import Gate, peers_route
from elasticjob_store.protocol_state import StateWire
from elasticjob_store.report import describe
from elasticjob_store.state import StateError

ERRORS: tuple[wire.ErrorAnswer, ...] = (
    (StateError, HTTPStatus.INTERNAL_SERVER_ERROR, "rendezvous state refused: "),
    (ConflictError, HTTPStatus.CONFLICT, ""),
    (RuntimeError, HTTPStatus.SERVICE_UNAVAILABLE, "store: "),  # the TCPStore client's errors
)


def make_server(control: Control, host: str, port: int, credential: Credential,
                gate: Gate | None = None) -> CappedHTTPServer:
    epoch = secrets.token_hex(8)  # per process start: tells the operator that counts and history restarted

    def state_view(_body: Any, query: wire.Query) -> StateWire:
        """With ?after=N&epoch=E&wait=S: answered once the summary's version passes N (or the epoch is not E,
        i.e. this store restarted), or after S seconds: a long-poll, so the operator learns of a failure
        round or a stale heartbeat within the poller's tick without polling every store."""
        asked = protocol.StateQuery.from_query(query)
        if asked.holds(epoch):
            wait_for_change(control, asked.after, asked.wait)
        _, state = control.read()
        with control.lock:
            now = control.now()
            return describe(state, control.tracker, now=now, epoch=epoch, run_id=control.run_id,
                            min_nodes=control.min_nodes, max_nodes=control.max_nodes, version=control.version,
                            stale_after=control.stale_after, torch=control.torch_report(),
                            progress=control.progress.describe(now), stop=control.stop_record,
                            pace=control.pace.by_pod(now), peers=control.gate() if control.gate else None,
                            node_checks=control.node_checks.describe(), links=control.links.describe(),
                            seats=control.seats.describe(), unanswered=control.silences.silent(now))

    def remove(body: Any, _query: wire.Query) -> dict[str, Any]:
        asked = protocol.Remove.from_wire(body)
        outcome = control.remove(asked.addr, asked.heartbeat_before)
        removed = tuple(protocol.NodeRef(node.addr, node.pid, node.local_id) for node in outcome.nodes)
        return protocol.RemoveReply(outcome.state is not None, outcome.reason,
                                    outcome.reason if outcome.refused else None, removed).to_wire()

    def complete(body: Any, _query: wire.Query) -> dict[str, Any]:
        outcome = control.complete(protocol.Complete.from_wire(body).live_nodes)
        return protocol.CompleteReply(outcome.state is not None, outcome.reason, completed=outcome.done).to_wire()

    def hold(body: Any, _query: wire.Query) -> dict[str, Any]:
        asked = protocol.Hold.from_wire(body)
        outcome, until = control.hold(asked.round, asked.seconds)
        return protocol.HoldReply(outcome.state is not None, outcome.reason, held_until=until).to_wire()

    def restart(body: Any, _query: wire.Query) -> dict[str, Any]:
        outcome = control.restart(protocol.Restart.from_wire(body).round)
        return protocol.RestartReply(outcome.state is not None, outcome.reason, restarting=outcome.done).to_wire()

    def reopen(body: Any, _query: wire.Query) -> dict[str, Any]:
        outcome = control.reopen(protocol.Reopen.from_wire(body).round)
        return protocol.RestartReply(outcome.state is not None, outcome.reason, restarting=outcome.done).to_wire()

    def stop(body: Any, _query: wire.Query) -> dict[str, Any]:
        asked = protocol.Stop.from_wire(body)
        return control.stop(asked.requested_at, asked.margin_seconds).to_wire()

    def seats(body: Any, _query: wire.Query) -> dict[str, Any]:
        count = protocol.Seats.from_wire(body).count
        changed = control.set_seats(count)
        return protocol.ActionReply(changed, f"{count} seat(s)" if count else "no seats: every agent joins").to_wire()

    routes: dict[tuple[str, str], wire.Route] = {
        ("GET", protocol.STATE): state_view,
        ("POST", protocol.path(protocol.Remove)): remove,
        ("POST", protocol.path(protocol.Complete)): complete,
        ("POST", protocol.path(protocol.Hold)): hold,
        ("POST", protocol.path(protocol.Restart)): restart,
        ("POST", protocol.path(protocol.Stop)): stop,
        ("POST", protocol.path(protocol.Reopen)): reopen,
        ("POST", protocol.path(protocol.Peers)): peers_route(gate),
        ("POST", protocol.path(protocol.Seats)): seats,
    }
    return wire.make_server(routes, host, port, credential, ERRORS,
                            log=lambda line: control.log(f"refusing the stored state: {line}"))

