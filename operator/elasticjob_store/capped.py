"""A threading HTTP server that serves at most a fixed number of connections at once, and a few per peer.

Anyone who reaches the store's control port can open connections; each holds a thread for up to the handler's
deadline (a long-poll up to a minute, once its request is in). Unbounded, a few thousand idle sockets exhaust the
pod's memory or threads and take the store with them; bounded only in all, 32 slow clients from one address would
lock the operator out. Past either cap a connection is closed at once, unanswered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from socketserver import BaseRequestHandler
from typing import Any

# The operator keeps one long-poll open per store and sends an action now and then; the kubelet probes
# /healthz every few seconds. 32 is many times that, and 4 from one address twice what the operator needs.
MAX_CONNECTIONS = 32
MAX_PER_PEER = 4


class CappedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Callable[..., BaseRequestHandler],
                 max_connections: int = MAX_CONNECTIONS, max_per_peer: int = MAX_PER_PEER) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_per_peer = max_per_peer
        self._peers: dict[str, int] = {}
        self._peers_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        if not self._enter(peer):
            self.shutdown_request(request)
            return
        if not self.slots.acquire(blocking=False):
            self._leave(peer)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # no thread started, so none will release it
            self._leave(peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
            self._leave(str(client_address[0]) if isinstance(client_address, tuple) else str(client_address))

    def _enter(self, peer: str) -> bool:
        with self._peers_lock:
            held = self._peers.get(peer, 0)
            if held >= self.max_per_peer:
                return False
            self._peers[peer] = held + 1
            return True

    def _leave(self, peer: str) -> None:
        with self._peers_lock:
            held = self._peers.get(peer, 0) - 1
            if held > 0:
                self._peers[peer] = held
            else:
                self._peers.pop(peer, None)
