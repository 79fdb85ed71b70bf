"""The rendezvous pod's process: the TCPStore the agents meet in, the control endpoint, the round poller.

Environment (set by the operator on the pod):
  ELASTICJOB_RDZV_PORT           the store's port; the control endpoint listens on the next
                                 (protocol.control_port)
  ELASTICJOB_RDZV_RUN_ID         torch's run id (the job's UID): the state is under torch.rendezvous.<run id>
  ELASTICJOB_RDZV_MIN_NODES      the job's min nodes, as the agents' --nnodes (default 1)
  ELASTICJOB_RDZV_MAX_NODES      the job's max nodes (default: no limit). The agents recheck both before they
                                 complete a round, so wrong values make a nudge do nothing, never harm
  ELASTICJOB_RDZV_READ_TIMEOUT   seconds, the store's timeout (default 60)
  ELASTICJOB_RDZV_TOKEN_SHA256   the SHA-256 (hex) of the control endpoint's bearer token
  ELASTICJOB_RDZV_TOKEN_FILE     or a file holding the token itself (neither: every control request is refused)
  ELASTICJOB_RDZV_STALE_MS       a heartbeat older than this is reported stale (one missed keep-alive; default
                                 never)
  ELASTICJOB_RDZV_PEER_CHECK     1 (default): the store's port answers only the addresses the operator names
                                 (gate.py); 0: every peer, as torch's TCPStore does
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta
from typing import Any

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
NO_LIMIT = 2**31 - 1
PROGRAM = "elasticjob rendezvous store"


class ConfigError(ValueError):
    pass


def _int_env(name: str, default: int | None, low: int, high: int = NO_LIMIT) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ConfigError(f"{name} is required")
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None
    if not low <= number <= high:
        raise ConfigError(f"{name}={number} is outside {low}..{high}")
    return number


def main() -> None:
    # Usually blocked already by __main__ before torch was imported; blocking again is harmless.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        port = _int_env("ELASTICJOB_RDZV_PORT", None, 1, 65534)
        run_id = os.environ.get("ELASTICJOB_RDZV_RUN_ID", "")
        if not run_id:
            raise ConfigError("ELASTICJOB_RDZV_RUN_ID is required")
        min_nodes = _int_env("ELASTICJOB_RDZV_MIN_NODES", 1, 1)
        max_nodes = _int_env("ELASTICJOB_RDZV_MAX_NODES", NO_LIMIT, min_nodes)
        read_timeout = _int_env("ELASTICJOB_RDZV_READ_TIMEOUT", 60, 1)
        stale_ms = _int_env("ELASTICJOB_RDZV_STALE_MS", NO_LIMIT, 1)
        peer_check = bool(_int_env("ELASTICJOB_RDZV_PEER_CHECK", 1, 0, 1))
    except ConfigError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr, flush=True)
        sys.exit(2)

    import torch.distributed

    dist: Any = torch.distributed  # TCPStore is not in its stubs

    from elasticjob_store import compat, gate, wire
    from elasticjob_store.auth import TOKEN_MIN_BYTES, Credential
    from elasticjob_store.protocol import control_port

    verdict = compat.probe()
    print(f"{PROGRAM}: nudges {'on' if verdict.nudges else 'OFF'}: {verdict.why}", flush=True)
    log = lambda line: print(line, flush=True)  # noqa: E731
    fence: gate.Gate | None = None
    # multi_tenant: agents of every round share this one store; wait_for_workers=False: agents come and go.
    if peer_check:  # the TCPStore on the loopback alone, the gate on the store's port in front of it
        inner = gate.inner_socket()
        inner_port = inner.getsockname()[1]
        store = dist.TCPStore("127.0.0.1", inner_port, is_master=True, wait_for_workers=False, multi_tenant=True,
                              timeout=timedelta(seconds=read_timeout), master_listen_fd=inner.fileno())
        fence = gate.Gate(port, inner_port, log=log)
        wire.listen_or_exit(PROGRAM, port, fence.start)
    else:  # listens on every address whatever the host; the host is where the store's own client connects
        store = wire.listen_or_exit(PROGRAM, port, lambda: dist.TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
            timeout=timedelta(seconds=read_timeout)))
    credential = Credential.from_env()
    control_at = control_port(port)
    try:
        from elasticjob_store.control import Control, start_poller
        from elasticjob_store.server import make_server
    except ImportError as err:  # this torch lacks a name the state decoder imports: plain c10d only
        from elasticjob_store.plain import make_plain_server
        if verdict.nudges:
            verdict = compat.Verdict(verdict.torch, False, str(err))
        server = wire.listen_or_exit(PROGRAM, control_at, lambda: make_plain_server(
            verdict, "", control_at, credential, gate.peers_route(fence), fence.report if fence else None))
    else:
        from elasticjob_store import peers

        control = Control(store, run_id, min_nodes, max_nodes, log=log, stale_after=stale_ms / 1000,
                          verdict=verdict, connections=lambda: peers.connected(port),
                          gate=fence.report if fence else None)
        server = wire.listen_or_exit(PROGRAM, control_at, lambda: make_server(control, "", control_at, credential,
                                                                              fence))
        start_poller(control, threading.Event())
    threading.Thread(target=server.serve_forever, name="control-http", daemon=True).start()
    auth = "token required" if credential.configured() else \
        f"no token configured (or one shorter than {TOKEN_MIN_BYTES} bytes): control requests refused"
    peers_said = "the job's pods only" if fence else "every peer"
    print(f"elasticjob rendezvous store listening on port {port} ({peers_said}), control on {control_at} ({auth}); "
          f"run {run_id}, nodes {min_nodes}..{max_nodes}", flush=True)
    signal.sigwait(STOP_SIGNALS)
    print("elasticjob rendezvous store stopping", flush=True)
    os._exit(0)  # the store's server thread is C++ with no clean shutdown path; skip its destructor
