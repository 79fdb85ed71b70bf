"""The operator's reader of the rendezvous pod's state endpoint, against a real HTTP server."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading

import pytest

from elasticjob import rendezvous_client
from elasticjob.observe import RendezvousView


def serve(body: bytes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("body, expected", [
    (json.dumps({"round": 2, "nodes": 3, "complete": True}).encode(), RendezvousView(round=2, nodes=3)),
    (json.dumps({"round": None}).encode(), None),
    (b"not json", None),
])
def test_fetch(body, expected):
    server = serve(body)
    try:
        assert asyncio.run(rendezvous_client.fetch("127.0.0.1", server.server_address[1])) == expected
    finally:
        server.shutdown()


def test_nothing_listening_is_none():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert asyncio.run(rendezvous_client.fetch("127.0.0.1", port)) is None
