"""The worker torchrun starts: hand the work to the pod's warm server and stand in for the forked worker.

To torchrun this process is the worker: its signals are forwarded to the forked worker's process group, and
it exits as that worker did (by the same signal, when a signal ended it). If no server can be had, the script
runs here, cold, as it would have without this module.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any

from elasticjob_warm import protocol, runner

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
START_TIMEOUT = 10.0  # for the server to listen; it imports torch only after that
LOCK_TIMEOUT = 10.0  # the longest another rank can hold the lock while it starts the server: START_TIMEOUT


class Unavailable(Exception):
    """No warm server: the script runs in this process instead."""


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m elasticjob_warm SCRIPT [ARGS...] | -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    forwarder = Forwarder()
    try:
        sock = connect_or_start(protocol.socket_path(os.getppid()), os.getppid())
        reply = sock.makefile("rb")
        protocol.send_request(sock, request(argv), [0, 1, 2])
        pid = _first_answer(reply)
    except (Unavailable, OSError, protocol.ProtocolError) as error:
        print(f"elasticjob_warm: no warm worker ({error}); running {argv[0]} cold", file=sys.stderr, flush=True)
        forwarder.restore()
        return runner.run(argv)
    forwarder.attach(pid)
    return mirror(_last_answer(reply, pid))


def request(argv: list[str]) -> protocol.Request:
    return protocol.Request(argv=list(argv), env=dict(os.environ), cwd=os.getcwd(),
                            unbuffered=bool(getattr(sys.stdout, "write_through", False)))  # python -u


def connect_or_start(path: str, agent_pid: int) -> socket.socket:
    """A connection to the agent's server, started here if there is none."""
    protocol.check_private_dir(path)
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(path + ".lock", "a") as lock:
        _lock(lock, path)  # one server per agent, however many local ranks start at once
        return _connect(path) or _start(path, agent_pid)


def probe(sock: socket.socket) -> socket.socket:
    """A connection from connect_or_start that says nothing: the server closes it as soon as it accepts it,
    which it does only once its imports are done (one thread: it is importing until then)."""
    sock.shutdown(socket.SHUT_WR)
    return sock


def until_warm(sock: socket.socket, timeout: float) -> bool:
    """Waits on a probe until the server has closed it. True when that came within `timeout` (or the server is
    gone: its workers then start cold, so nothing is worth waiting for); the probe is closed either way."""
    with sock:
        try:
            sock.settimeout(timeout)
            return sock.recv(1) == b""
        except OSError:  # socket.timeout included
            return False


def _lock(lock: IO[Any], path: str) -> None:
    # Whoever holds the lock for ever (a wedged or hostile process) costs each worker a cold start, not a hang.
    deadline = time.monotonic() + LOCK_TIMEOUT
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Unavailable(f"{path}.lock was held for more than {LOCK_TIMEOUT:.0f} s") from None
            time.sleep(0.02)


def _start(path: str, agent_pid: int) -> socket.socket:
    server = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.server", path, str(agent_pid)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _connect(path, server.pid)
        if sock is not None:
            return sock
        if server.poll() is not None:
            raise Unavailable(f"the warm server exited with {server.returncode}")
        time.sleep(0.02)
    raise Unavailable(f"the warm server did not listen on {path} within {START_TIMEOUT:.0f} s")


def _connect(path: str, server_pid: int | None = None) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _check_server(sock, path, server_pid)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def _check_server(sock: socket.socket, path: str, expected_pid: int | None) -> None:
    """The process listening must be our uid's warm server for this path, in our PID namespace: it will get
    the worker's stdin, stdout, stderr and environment."""
    pid, uid = protocol.peer(sock)
    if uid != os.getuid() or pid == 0 or (expected_pid is not None and pid != expected_pid):
        raise Unavailable(f"{path} is served by pid {pid} of uid {uid}, not by a warm server of ours")
    if expected_pid is None and _command(pid)[-3:-1] != ["elasticjob_warm.server", path]:
        raise Unavailable(f"{path} is served by pid {pid}, which is not an elasticjob_warm server")


def _command(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return [arg.decode(errors="replace") for arg in cmdline.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _first_answer(reply: IO[bytes]) -> int:
    message = _read(reply)
    if "error" in message:
        raise Unavailable(message["error"])
    return int(message["pid"])


def _last_answer(reply: IO[bytes], pid: int) -> int:
    try:
        return int(_read(reply)["status"])
    except (OSError, protocol.ProtocolError, KeyError, ValueError) as error:
        # The server is gone; its worker must not train on unseen.
        print(f"elasticjob_warm: lost the warm server ({error}); killing worker {pid}", file=sys.stderr, flush=True)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        return 1


def _read(reply: IO[bytes]) -> dict[str, Any]:
    line = reply.readline()
    if not line:
        raise protocol.ProtocolError("the warm server closed the connection")
    try:
        answer: dict[str, Any] = json.loads(line)
        return answer
    except ValueError as error:
        raise protocol.ProtocolError(f"unreadable answer {line[:80]!r}") from error


def mirror(status: int) -> int:
    """Exit as the worker did: by its signal when one ended it (torchrun reports "Signal 9"), else its code."""
    if status >= 0:
        return status
    try:
        signal.signal(-status, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL and SIGSTOP have no handler to reset
    os.kill(os.getpid(), -status)
    return 128 - status


class Forwarder:
    """torchrun signals this process's group; the forked worker has a group of its own."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.previous = {sig: signal.signal(sig, self._handle) for sig in FORWARDED}

    def attach(self, pid: int) -> None:
        self.pid = pid
        for sig in self.pending:
            self._send(sig)
        self.pending.clear()

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        for pending in self.pending:
            os.kill(os.getpid(), pending)  # what arrived before the fallback is not lost

    def _handle(self, sig: int, _frame: Any) -> None:
        if self.pid is None:
            self.pending.append(sig)
        else:
            self._send(sig)

    def _send(self, sig: int) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass  # it has just ended; its status is on its way
