"""A Service the operator made counts as made even when the watch delivered it before the create's reply: the
job's next pass (its workers) then runs at once, not after every other job's turn."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import factory
import pytest
from kubernetes.client import ApiClient, Configuration

from elasticjob import builders, k8s, planner
from elasticjob.controller.apply import apply
from elasticjob.controller.context import Context
from elasticjob.controller.mirror import Mirror
from elasticjob.domain import Settings
from elasticjob.rendezvous_client import StoreClient

UID = "svc-uid"
REF = factory.job().ref


class Created(BaseHTTPRequestHandler):
    """Answers a create with the object as stored: the posted manifest with a uid and a ClusterIP."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        manifest = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        manifest["metadata"]["uid"] = UID
        manifest["metadata"]["resourceVersion"] = "7"
        manifest["spec"]["clusterIP"] = "10.96.0.9"
        body = json.dumps(manifest).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Created)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("watch_first", [False, True])
def test_a_created_service_counts_whether_the_watch_or_the_reply_came_first(server, watch_first):
    ctx = Context(kube=k8s.Kube(ApiClient(Configuration(host=server)), ThreadPoolExecutor(1)), mirror=Mirror(),
                  stores=StoreClient(b"k" * 32), settings=Settings(), logger=logging.getLogger("test"), instance="t")
    manifest = builders.rendezvous_service(REF)
    if watch_first:  # the watch's ADDED event was handled while the create's reply was on its way
        stored = {**manifest, "metadata": {**manifest["metadata"], "uid": UID, "resourceVersion": "7"},
                  "spec": {**manifest["spec"], "clusterIP": "10.96.0.9"}}
        ctx.mirror.cache("services").apply("ADDED", stored)
    log = logging.LoggerAdapter(logging.getLogger("test"), {})
    applied = asyncio.run(apply(ctx, REF, [planner.CreateObject(manifest)], [], log))
    assert applied.created == ["Service"]
    assert ctx.mirror.owned_service((REF.namespace, REF.name), REF.uid, manifest["metadata"]["name"]) is not None
