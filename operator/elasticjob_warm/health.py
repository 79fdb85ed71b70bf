"""GET /healthz on ELASTICJOB_HEALTH_PORT: the worker pod's readiness, judged by its agent's rendezvous store.

A pod whose network is cut off keeps its processes, so the kubelet keeps it Ready, and the operator had no
evidence of its own to replace it on. Its agent sees the loss first: its store stops answering. So the agent
answers the kubelet's readiness probe (the operator sets the port and the probe) from its store operations:
every successful read or write of the rendezvous state (the keep-alive, the join loop, the check for waiting
nodes) is an answer, and torch makes one at least every keep-alive interval.

Healthy: an answer within `limit` seconds (max(FLOOR, KEEP_ALIVES keep-alive intervals)), or, past that, the
store gone for everyone rather than for this pod. A plain TCP connect to the store's address tells them apart,
tried only once the answers are stale (the store reads its kernel connection table to spot agents that left;
a steady stream of short connections from a pod must not reach it) and at most once a CHECK_EVERY:
refused (the Service has no endpoint: the store pod is gone, which every agent shares and the operator handles)
or accepted (the store's own trouble) is healthy; a timeout or an unreachable network is this pod cut off.
Before the agent's first answer: 503, so READY means "in the round". Without the env: no server, nothing changes.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any

from elasticjob_warm.notice import host_port

PORT_ENV = "ELASTICJOB_HEALTH_PORT"
PATH = "/healthz"
# Seconds without an answer from the store before the connect check, or this many keep-alive intervals where
# that is longer. Two: torch's agent answers at every keep-alive (1 s as the operator sets it), so two missed in a
# row are a cut, not a slow answer; and a slow store still accepts the connect (healthy). Three cost the cut-off
# pod's replacement a second more (13.1-13.7 s to full size, against a target of 10).
FLOOR = 2.0
KEEP_ALIVES = 2
TORCH_KEEP_ALIVE = 5.0  # torch's keep_alive_interval where --rdzv-conf names none
CONNECT_SECONDS = 0.5
CHECK_EVERY = 1.0  # a connect's verdict is reused this long: the kubelet's 1 s probes make one connect a second
# A connect that fails with these reached nobody: this pod's network, not the store.
UNREACHED = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.ETIMEDOUT})


def log(message: str) -> None:
    print(f"elasticjob_warm.torchrun: {message}", file=sys.stderr, flush=True)


def connect(host: str, port: int, timeout: float = CONNECT_SECONDS) -> str:
    """'answers' (the connect completed), 'silent' (no answer in `timeout`, no route, or a name the resolver
    cannot answer for), or 'refused' (an answer that says no: refused, reset, no such name)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.timeout:  # TimeoutError from 3.10 on; a separate OSError before
        return "silent"
    except socket.gaierror as error:
        return "silent" if error.errno == socket.EAI_AGAIN else "refused"
    except OSError as error:
        return "silent" if error.errno in UNREACHED else "refused"
    return "answers"


def limit(rdzv_conf: str | None) -> float:
    """How long the store may stay silent, from torchrun's --rdzv-conf (key=value,...)."""
    interval = TORCH_KEEP_ALIVE
    for pair in (rdzv_conf or "").split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "keep_alive_interval":
            try:
                interval = float(value)
            except ValueError:
                pass  # torch refuses it itself
    return max(FLOOR, KEEP_ALIVES * interval)


class Health:
    """The agent's view of its store, for the probe. `address`: the store's (HOST, PORT); None for --standalone,
    whose store is this agent's own. `always`: healthy whatever happens (a torch this cannot see into)."""

    def __init__(self, address: tuple[str, int] | None, probe: Callable[[str, int], str] = connect,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address, self.probe, self.clock = address, probe, clock
        self.limit = FLOOR
        self.always = False
        self.last: float | None = None
        self._lock = threading.Lock()
        self._checked: tuple[float, str] | None = None

    def answered(self) -> None:
        self.last = self.clock()

    def status(self) -> tuple[bool, str]:
        """(healthy, the one line the probe answers)."""
        if self.always:
            return True, "ok"
        if self.last is None:
            return False, "not in the rendezvous yet"
        quiet = self.clock() - self.last
        if quiet <= self.limit or self.address is None:
            return True, "ok"
        where = "{}:{}".format(*self.address)
        verdict = self.verdict()
        if verdict == "silent":
            return False, f"no answer from the rendezvous store at {where} for {quiet:.0f} s: this pod is cut off"
        if verdict == "refused":
            return True, f"ok: the rendezvous store at {where} is gone for every agent (connection refused)"
        return True, f"ok: the rendezvous store at {where} accepts connections but has not answered for {quiet:.0f} s"

    def verdict(self) -> str:
        """The connect's, reused for CHECK_EVERY (one check at a time: the others wait for its verdict)."""
        assert self.address is not None
        with self._lock:
            if self._checked is None or self.clock() - self._checked[0] >= CHECK_EVERY:
                found = self.probe(*self.address)
                self._checked = (self.clock(), found)
            return self._checked[1]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server: Any = self.server
        if self.path.split("?", 1)[0] == PATH:
            healthy, text = server.health.status()
            code = 200 if healthy else 503
        else:
            code, text = 404, "not found"
        body = (text + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass  # a probe a second would flood the pod's log


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, family: socket.AddressFamily, port: int, health: Health) -> None:
        self.address_family, self.health = family, health
        super().__init__(("::" if family == socket.AF_INET6 else "0.0.0.0", port), _Handler)

    def server_bind(self) -> None:
        """TCPServer's bind, without HTTPServer's lookup of this host's name, and IPv4 too on an IPv6 socket."""
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        TCPServer.server_bind(self)
        self.server_name, self.server_port = "", self.server_address[1]


def serve(health: Health, port: int) -> ThreadingHTTPServer:
    """Answers on every address of the pod, IPv6 and IPv4 (IPv4 alone where the kernel has no IPv6), from a
    daemon thread. Raises OSError when the port cannot be had."""
    try:
        server = _Server(socket.AF_INET6, port, health)
    except OSError:
        server = _Server(socket.AF_INET, port, health)
    threading.Thread(target=server.serve_forever, name="elasticjob-health", daemon=True).start()
    return server


def start(address: str | None, environ: dict[str, str]) -> Health | None:
    """The agent's health and its server, where ELASTICJOB_HEALTH_PORT asks for one; `address`: the store's
    HOST:PORT (notice.endpoint). None (said once in the pod's log) where it cannot listen."""
    value = environ.get(PORT_ENV)
    if not value:
        return None
    health = Health(host_port(address) if address else None)
    try:
        serve(health, int(value))
    except (OSError, ValueError, OverflowError) as error:
        log(f"no health endpoint on {PORT_ENV}={value} ({error}); the agent runs on without one")
        return None
    return health


def watch(health: Health, rdzv_conf: str | None) -> Callable[[], None] | None:
    """Counts every successful read and write of the rendezvous state as the store's answer (torch's backend
    class, so that the backend outage.py makes on a new store counts as well). Returns how to undo it; None
    where this torch's backend is not the known one, and then the health is `always` healthy."""
    health.limit = limit(rdzv_conf)
    try:
        from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
        backend: Any = getattr(c10d, "C10dRendezvousBackend", None)
    except ImportError:
        backend = None
    originals = {name: getattr(backend, name, None) for name in ("get_state", "set_state")}
    if not all(callable(method) for method in originals.values()):
        health.always = True
        return None

    def counted(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self, *args, **kwargs)
            health.answered()
            return result
        return call

    for name, method in originals.items():
        setattr(backend, name, counted(method))  # type: ignore[arg-type]

    def undo() -> None:
        for name, method in originals.items():
            setattr(backend, name, method)
    return undo
