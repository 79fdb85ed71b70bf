"""What the client and the server say to each other over the pod-local Unix socket.

A request is one byte carrying the client's stdin, stdout and stderr (SCM_RIGHTS), then a length-prefixed JSON
object: argv, env, cwd and whether Python runs unbuffered. The server answers with JSON lines: {"pid": N}
once the worker is forked, then {"status": S} when it ended (S as os.waitstatus_to_exitcode: negative for a
signal), or {"error": "..."} if it will not fork, in which case the client runs the script itself.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SOCKET_ENV = "ELASTICJOB_WARM_SOCKET"
PRELOAD_ENV = "ELASTICJOB_WARM_PRELOAD"
MAX_REQUEST = 16 * 1024 * 1024  # an environment of a few hundred KB is already unusual
_LENGTH = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")


class ProtocolError(Exception):
    """The other side sent something this side cannot read."""


@dataclass(frozen=True)
class Request:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    unbuffered: bool = False


def socket_path(agent_pid: int, environ: Mapping[str, str] | None = None) -> str:
    """One server per torchrun agent. elasticjob_warm.torchrun passes its workers a random path (SOCKET_ENV);
    under plain torchrun the workers find it by the agent's pid and PID namespace (pods on one node may share
    /tmp, and in a container every agent may have the same pid). Either way the socket sits in a directory
    only its owner may enter (check_private_dir)."""
    environ = os.environ if environ is None else environ
    if environ.get(SOCKET_ENV):
        return environ[SOCKET_ENV]
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return os.path.join(tempfile.gettempdir(), f"elasticjob-warm-{namespace}-{agent_pid}", "server.sock")


def new_socket_path() -> str:
    """A path nobody can guess, in a fresh 0700 directory, for an agent to pass to its workers."""
    return os.path.join(tempfile.mkdtemp(prefix="elasticjob-warm-"), "server.sock")


def check_private_dir(path: str) -> None:
    """Makes the socket's directory 0700, or checks that the one there is: ours, not a link, closed to others.

    A directory another user made first could hold their socket; PermissionError then, and the worker runs
    cold. (Abstract sockets would not do: every container of a pod shares their network namespace.)
    """
    directory = os.path.dirname(path) or "."
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"{directory} is not a directory private to uid {os.getuid()} "
                              f"(owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")


def peer(sock: socket.socket) -> tuple[int, int]:
    """The other end's pid and uid. The pid is 0 when that process is outside this PID namespace (a sidecar
    that only shares a volume with us)."""
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


def send_request(sock: socket.socket, request: Request, fds: list[int]) -> None:
    body = json.dumps({"argv": request.argv, "env": request.env, "cwd": request.cwd,
                       "unbuffered": request.unbuffered}).encode()
    socket.send_fds(sock, [b"R"], fds)
    sock.sendall(_LENGTH.pack(len(body)) + body)


class Probe(Exception):
    """A connection closed without a word: someone checking that the server listens."""


def recv_request(sock: socket.socket) -> tuple[Request, list[int]]:
    """The request and the client's stdin, stdout and stderr; the descriptors are closed if it is refused."""
    marker, fds, _flags, _addr = socket.recv_fds(sock, 1, 3)
    if marker == b"" and not fds:
        raise Probe()
    try:
        return _read_request(sock, marker, fds), fds
    except BaseException:
        close_all(fds)
        raise


def _read_request(sock: socket.socket, marker: bytes, fds: list[int]) -> Request:
    if marker != b"R" or len(fds) != 3:
        raise ProtocolError(f"expected a request carrying 3 descriptors, got {marker!r} with {len(fds)}")
    try:
        (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
        if length > MAX_REQUEST:
            raise ProtocolError(f"request of {length} bytes")
        raw = json.loads(_read_exactly(sock, length))
        request = Request(argv=[str(a) for a in raw["argv"]], env={str(k): str(v) for k, v in raw["env"].items()},
                          cwd=str(raw["cwd"]), unbuffered=bool(raw.get("unbuffered")))
    except (ProtocolError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ProtocolError(f"unreadable request: {error}") from error
    if not request.argv:
        raise ProtocolError("empty argv")
    return request


def close_all(items: list[Any]) -> None:
    """Close descriptors (ints) and objects with close(), whatever state each is in."""
    for item in items:
        try:
            if isinstance(item, int):
                os.close(item)
            else:
                item.close()
        except OSError:
            pass


def send_message(sock: socket.socket, **message: object) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise ProtocolError("connection closed in the middle of a request")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
