"""A threading HTTP server that serves at most a fixed number of connections at once.

Anyone who reaches the store's control port can open connections; each holds a thread for up to the handler's
timeout (a long-poll up to a minute). Unbounded, a few thousand idle sockets exhaust the pod's memory or
threads and take the store with them. Past the cap a connection is closed at once, unanswered.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from socketserver import BaseRequestHandler
from typing import Any

# The operator keeps one long-poll open per store and sends an action now and then; the kubelet probes
# /healthz every few seconds. 32 is many times that.
MAX_CONNECTIONS = 32


class CappedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Callable[..., BaseRequestHandler],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # no thread started, so none will release it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
