"""`python -m elasticjob_warm.server SOCKET AGENT_PID`: import torch once, fork a worker per request.

Started by `elasticjob_warm.torchrun` as the agent starts, or else by the agent's first client, in a session of
its own so that torchrun's signals to a worker's process group do not reach it. It listens before it imports, so
clients queue rather than start servers of their own, and it lives as long as the agent: when the agent is gone
it kills what it forked and leaves. One thread only: a fork copies the thread that calls it, and a lock another
thread held would stay held for ever in the child.
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import sys

from elasticjob_warm import child, protocol

DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.optim", "torch._dynamo")
REQUEST_TIMEOUT = 5.0


def log(message: str) -> None:
    print(f"elasticjob_warm.server[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def preload(names: list[str]) -> str | None:
    """Import what every worker would; say why forking would be unsafe, if it would be."""
    # A module that asks whether CUDA is available at import would initialize the CUDA runtime here, which a
    # forked child cannot use; NVML answers the question without it. The workers' own environment is theirs.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - a module that cannot load is simply not preloaded
            log(f"not preloaded: {name}: {error}")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialized while preloading; a forked worker could not use it"
    gc.freeze()  # what the preload allocated stays out of the collector's way, so pages stay shared
    return None


def preload_names(environ: dict[str, str]) -> list[str]:
    value = environ.get(protocol.PRELOAD_ENV)
    if value is None:
        return list(DEFAULT_PRELOAD)
    return [name.strip() for name in value.split(",") if name.strip()]


class Server:
    def __init__(self, path: str, agent_pid: int):
        self.path, self.agent_pid = path, agent_pid
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.children: dict[int, tuple[socket.socket | None, int]] = {}  # pid -> (client, pidfd)
        self.refusal: str | None = None

    def listen(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)  # a dead server's; the client starting us holds the lock
        old_umask = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old_umask)
        self.listener.listen(128)
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", 0))

    def serve(self) -> None:
        while self._agent_alive():
            for key, _ in self.selector.select(timeout=1.0):
                kind, pid = key.data
                if kind == "accept":
                    self._accept()
                elif kind == "client":
                    self._client_left(pid)
                else:
                    self._reap(pid)

    def stop(self) -> None:
        for pid in list(self.children):
            _kill_group(pid)
        # The agent is gone, so no client will come: leave no socket, lock or private directory behind.
        for remove, target in ((os.unlink, self.path), (os.unlink, self.path + ".lock"),
                               (os.rmdir, os.path.dirname(self.path))):
            try:
                remove(target)
            except OSError:
                pass  # the directory is the user's own (ELASTICJOB_WARM_SOCKET), or not empty

    def _agent_alive(self) -> bool:
        try:
            os.kill(self.agent_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(REQUEST_TIMEOUT)
        pid, uid = protocol.peer(conn)
        if uid != os.getuid() or pid == 0:  # pid 0: a process outside our PID namespace, not a worker of ours
            log(f"refused a client of uid {uid} (pid {pid})")
            conn.close()
            return
        try:
            request, fds = protocol.recv_request(conn)
        except protocol.Probe:
            conn.close()
            return
        except (protocol.ProtocolError, OSError) as error:
            log(f"dropped a request from pid {pid}: {error}")
            conn.close()
            return
        if self.refusal:
            _send(conn, error=self.refusal)
            protocol.close_all(fds)
            conn.close()
            return
        self._fork(conn, request, fds)

    def _fork(self, conn: socket.socket, request: protocol.Request, fds: list[int]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        closeables = [conn, self.listener, self.selector]
        closeables += [c for c, _ in self.children.values() if c is not None]
        closeables += [pidfd for _, pidfd in self.children.values()]
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            child.become(request, fds, closeables)
        try:
            os.setpgid(pid, pid)  # also here: the client may signal the group before the child ran at all
        except OSError:
            pass  # the child got there first, or has already exited
        protocol.close_all(fds)
        pidfd = os.pidfd_open(pid)
        conn.settimeout(None)
        self.children[pid] = (conn, pidfd)
        self.selector.register(conn, selectors.EVENT_READ, ("client", pid))
        self.selector.register(pidfd, selectors.EVENT_READ, ("exit", pid))
        _send(conn, pid=pid)

    def _client_left(self, pid: int) -> None:
        # A client says nothing after its request: readable means it died (torchrun SIGKILLed it, say), and its
        # worker must not train on alone.
        conn, pidfd = self.children[pid]
        if conn is not None:
            self.selector.unregister(conn)
            conn.close()
        self.children[pid] = (None, pidfd)
        _kill_group(pid)

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if conn is not None:
            self.selector.unregister(conn)
            _send(conn, status=os.waitstatus_to_exitcode(status))
            conn.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _send(conn: socket.socket, **message: object) -> None:
    try:
        protocol.send_message(conn, **message)
    except OSError:
        pass  # the client is gone; its worker is dealt with as for any client that left


def main(argv: list[str]) -> int:
    path, agent_pid = argv[0], int(argv[1])
    server = Server(path, agent_pid)
    server.listen()
    server.refusal = preload(preload_names(dict(os.environ)))
    if server.refusal:
        log(server.refusal)
    try:
        server.serve()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
