"""Every request gives its connection back: one kept-alive connection serves them all, whatever the call does
with the reply (an unread reply kept its connection, and the next request opened a new one: a TLS handshake)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client import ApiClient, Configuration

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
