"""Every request gives its connection back: one kept-alive connection serves them all, whatever the call does
with the reply (an unread reply kept its connection, and the next request opened a new one: a TLS handshake)."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes.client import ApiClient, Configuration

from elasticjob import k8s

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s", "namespace": "ns"}}


class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a connection serves many requests

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = json.dumps({**POD, "status": {}}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_one_connection_serves_every_kind_of_call(server):
    client = ApiClient(Configuration(host=server))
    kube = k8s.Kube(client, ThreadPoolExecutor(1))

    async def calls() -> None:
        for _ in range(3):
            await kube.post_event({"metadata": {"namespace": "ns"}})
            await kube.delete_pod("ns", "p", "uid", 0)
            await kube.apply(SLICE)
            await kube.patch_object("v1", "pods", "ns", "p", {"metadata": {}})
            await kube.create(POD)
            await kube.get_job("ns", "j")

    asyncio.run(calls())
    assert client.rest_client.pool_manager.connection_from_url(server).num_connections == 1
