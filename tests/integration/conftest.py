"""Fixtures of the integration tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import jobapi
import pytest
from kubernetes import client


@pytest.fixture(scope="session")
def pod_image(cluster) -> str:
    """The image the tests' pods run: on real local nodes the worker image from the local registry (with its pull
    secret, which the namespace fixture makes); process-backed nodes ignore it."""
    if cluster.pulls_from_registry:
        from localcluster import registry

        jobapi.use_image(registry.image("elasticjob-worker", f"{registry.VERSION}-cpu"),
                         registry.image("elasticjob-operator"), [registry.PULL_SECRET])
    return jobapi.POD_IMAGE["image"]


@pytest.fixture
def namespace(namespace: str, pod_image: str) -> str:
    """tests/conftest.py's namespace, with the session's pod image chosen before a test makes its pods."""
    return namespace


@pytest.fixture
def api(kube):
    """(custom objects, core) clients of the test cluster."""
    return client.CustomObjectsApi(kube), client.CoreV1Api(kube)
