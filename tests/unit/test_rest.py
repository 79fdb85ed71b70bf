"""Paths of API requests, and the operator's start without the client's generated API classes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from elasticjob import rest


@pytest.mark.parametrize(("built", "expected"), [
    (rest.resource("v1", "ns", "pods", "w-0", "log"), "/api/v1/namespaces/ns/pods/w-0/log"),
    (rest.resource("v1", None, "pods"), "/api/v1/pods"),
    (rest.resource("v1", None, "nodes", "node-1"), "/api/v1/nodes/node-1"),
    (rest.resource("elasticjob.dev/v1alpha1", "ns", "elasticjobs", "j", "status"),
     "/apis/elasticjob.dev/v1alpha1/namespaces/ns/elasticjobs/j/status"),
    (rest.resource("kueue.x-k8s.io/v1beta2", None, "workloads"),
     "/apis/kueue.x-k8s.io/v1beta2/workloads"),
    (rest.resource("kopf.dev/v1", None, "clusterkopfpeerings", "p"),
     "/apis/kopf.dev/v1/clusterkopfpeerings/p"),
])
def test_paths(built, expected):
    assert built == expected


def test_a_name_cannot_leave_its_path_segment():
    assert rest.resource("v1", None, "nodes", "a/../b?c") == "/api/v1/nodes/a%2F..%2Fb%3Fc"


# Built and run in a fresh interpreter: this one has imported whatever other tests imported.
LOADED = """
import json, sys
from kubernetes.client import ApiClient, Configuration
from elasticjob import k8s
from elasticjob.controller import watch
from elasticjob.domain import Settings
from elasticjob.controller.context import Context
from elasticjob.controller.mirror import Mirror
from elasticjob.rendezvous_client import StoreClient
import logging
from elasticjob.kueue.settings import KueueSettings, with_kueue
kube = k8s.Kube(ApiClient(Configuration()))
settings = with_kueue(Settings(), KueueSettings(on=True))
ctx = Context(kube=kube, mirror=Mirror(), stores=StoreClient(b"k" * 32), settings=settings,
              logger=logging.getLogger(), instance="t")
watch.sources(ctx, None)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("kubernetes.client.api."))))
"""


def test_the_operator_loads_none_of_the_generated_api_classes():
    """Each costs megabytes resident (CoreV1Api alone 21 MB): a third of the operator's memory at start."""
    out = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("POST", rest.resource("v1", "ns", "pods"), None, ("POST", "pods")),
    ("GET", rest.resource("v1", "ns", "pods"), {"watch": True}, ("WATCH", "pods")),
    ("GET", rest.resource("v1", None, "pods"), {"labelSelector": "a"}, ("LIST", "pods")),
    ("GET", rest.resource("v1", "ns", "pods", "w-0", "log"), None, ("GET", "pods/log")),
    ("PATCH", rest.resource("elasticjob.dev/v1alpha1", "ns", "elasticjobs", "j", "status"), None,
     ("PATCH", "elasticjobs/status")),
    ("GET", rest.resource("v1", None, "namespaces", "ns"), None, ("GET", "namespaces")),
    ("GET", rest.resource("v1", None, "nodes", "node-1"), None, ("GET", "nodes")),
    ("DELETE", rest.resource("kueue.x-k8s.io/v1beta2", "ns", "workloads", "w"), None, ("DELETE", "workloads")),
])
def test_each_request_is_counted_by_verb_and_resource(method, path, query, expected):
    assert rest.verb_and_resource(method, path, query) == expected
