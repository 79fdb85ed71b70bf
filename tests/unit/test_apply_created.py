"""A Service the operator made counts as made even when the watch delivered it before the create's reply: the
job's next pass (its workers) then runs at once, not after every other job's turn."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import factory
import pytest
from kubernetes.client import ApiClient, Configuration

import helpers
from elasticjob import builders, k8s, planner
from elasticjob.controller.apply import apply
from elasticjob.controller.context import Context
from elasticjob.controller.mirror import Mirror
from elasticjob.domain import Settings
from elasticjob.rendezvous_client import StoreClient

UID = "svc-uid"
REF = factory.job().ref


def stored(_method: str, manifest: dict | None) -> dict:
    """A create answered with the object as stored: the posted manifest with a uid and a ClusterIP."""
    return {**manifest, "metadata": {**manifest["metadata"], "uid": UID, "resourceVersion": "7"},
            "spec": {**manifest["spec"], "clusterIP": "10.96.0.9"}}


@pytest.fixture
def server():
    with helpers.json_server(stored) as url:
        yield url


@pytest.mark.parametrize("watch_first", [False, True])
def test_a_created_service_counts_whether_the_watch_or_the_reply_came_first(server, watch_first):
    ctx = Context(kube=k8s.Kube(ApiClient(Configuration(host=server)), ThreadPoolExecutor(1)), mirror=Mirror(),
                  stores=StoreClient(b"k" * 32), settings=Settings(), logger=logging.getLogger("test"), instance="t")
    manifest = builders.rendezvous_service(REF)
    if watch_first:  # the watch's ADDED event was handled while the create's reply was on its way
        ctx.mirror.cache("services").apply("ADDED", stored("POST", manifest))
    log = logging.LoggerAdapter(logging.getLogger("test"), {})
    applied = asyncio.run(apply(ctx, REF, [planner.CreateObject(manifest)], [], log))
    assert applied.created == ["Service"]
    assert ctx.mirror.owned_service((REF.namespace, REF.name), REF.uid, manifest["metadata"]["name"]) is not None
