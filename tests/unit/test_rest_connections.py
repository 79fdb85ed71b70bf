"""Every request gives its connection back: one kept-alive connection serves them all, whatever the call does
with the reply (an unread reply kept its connection, and the next request opened a new one: a TLS handshake)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client import ApiClient, Configuration
from prometheus_client import REGISTRY

import helpers
from elasticjob import k8s

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s", "namespace": "ns"}}


@pytest.fixture
def server():
    with helpers.json_server(lambda _method, _sent: {**POD, "status": {}}) as url:
        yield url


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


def test_every_request_sent_is_counted_once(server):
    """The operator's own share of the API server's load (bench/fleet_scale.py reads it): a call counted twice,
    or one that bypasses the count, would misstate requests per job."""
    kube = k8s.Kube(ApiClient(Configuration(host=server)), ThreadPoolExecutor(1))
    rows = [("POST", "events"), ("DELETE", "pods"), ("PATCH", "endpointslices"), ("POST", "pods")]
    before = [REGISTRY.get_sample_value("elasticjob_api_requests_total", {"verb": v, "resource": r}) or 0.0
              for v, r in rows]

    async def calls() -> None:
        await kube.post_event({"metadata": {"namespace": "ns"}})
        await kube.delete_pod("ns", "p", "uid", 0)
        await kube.apply(SLICE)
        await kube.create(POD)
        await kube.create(POD)

    asyncio.run(calls())
    after = [REGISTRY.get_sample_value("elasticjob_api_requests_total", {"verb": v, "resource": r}) for v, r in rows]
    assert [a - b for a, b in zip(after, before)] == [1, 1, 1, 2]
