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
import time
from pathlib import Path
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
    # Usually blocked already by __main__ before any thread started; blocking again is harmless.
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
        seat_count = _int_env("ELASTICJOB_RDZV_SEATS", 0, 0) or None  # 0: a job without spares
    except ConfigError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr, flush=True)
        sys.exit(2)

    from elasticjob_store import compat, gate, peers, wire
    from elasticjob_store.auth import TOKEN_MIN_BYTES, Credential
    from elasticjob_store.c10d_server import C10dServer
    from elasticjob_store.control import Control, start_poller
    from elasticjob_store.protocol import control_port
    from elasticjob_store.server import make_server

    log = lambda line: print(line, flush=True)  # noqa: E731
    fence: gate.Gate | None = None
    # The pure-Python c10d server: no torch imported before the agents are served (c10d_server.py).
    if peer_check:  # the store on the loopback alone, the gate on the store's port in front of it
        inner = gate.inner_socket()
        server = C10dServer(sock=inner, log=log).start()
        fence = gate.Gate(port, inner.getsockname()[1], log=log)
        wire.listen_or_exit(PROGRAM, port, fence.start)
    else:  # every address: the store's own client is a LocalStore, no socket between
        server = wire.listen_or_exit(PROGRAM, port, lambda: C10dServer(None, port, log=log).start())
    credential = Credential.from_env()
    control_at = control_port(port)
    control = Control(server.local(read_timeout), run_id, min_nodes, max_nodes, log=log,
                      stale_after=stale_ms / 1000, verdict=compat.checking(), tables=lambda: peers.read(port),
                      gate=fence.report if fence else None, seat_count=seat_count)
    http = wire.listen_or_exit(PROGRAM, control_at, lambda: make_server(control, "", control_at, credential, fence))
    start_poller(control, threading.Event())
    threading.Thread(target=http.serve_forever, name="control-http", daemon=True).start()
    threading.Thread(target=_check_torch, args=(control,), name="torch-check", daemon=True).start()
    auth = "token required" if credential.configured() else \
        f"no token configured (or one shorter than {TOKEN_MIN_BYTES} bytes): control requests refused"
    peers_said = "the job's pods only" if fence else "every peer"
    print(f"elasticjob rendezvous store listening on port {port} ({peers_said}), control on {control_at} ({auth}); "
          f"run {run_id}, nodes {min_nodes}..{max_nodes}; serving {_since_start()} after its process started",
          flush=True)
    signal.sigwait(STOP_SIGNALS)
    print("elasticjob rendezvous store stopping", flush=True)
    os._exit(0)  # the daemon threads hold no state worth a clean shutdown; the agents see the port close


def _since_start() -> str:
    """Seconds since this process started, from the kernel's start time (field 22 of /proc/self/stat, in clock
    ticks since boot): what a container start costs before the store serves (docs/benchmarks.md)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return f"{time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf('SC_CLK_TCK'):.2f} s"
    except (OSError, ValueError, IndexError, AttributeError):
        return "(unknown) s"


def _check_torch(control: Any) -> None:
    """The torch check (seconds of CPU: it imports torch) in a child process at the lowest priority, while the
    store already serves: the nudges stay off until it says they may be on."""
    from elasticjob_store import compat

    verdict = compat.probe_in_child()
    control.verdict = verdict
    print(f"{PROGRAM}: nudges {'on' if verdict.nudges else 'OFF'}: {verdict.why}", flush=True)
