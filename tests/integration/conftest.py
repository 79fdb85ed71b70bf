"""Fixtures of the integration tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest
from kubernetes import client


@pytest.fixture
def api(kube):
    """(custom objects, core) clients of the test cluster."""
    return client.CustomObjectsApi(kube), client.CoreV1Api(kube)
