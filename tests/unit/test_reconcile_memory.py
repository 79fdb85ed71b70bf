"""What a job's loop keeps between reconciles: the body of its last status write only until the watch has it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kubernetes.client import ApiClient, Configuration

from elasticjob import k8s, naming
from elasticjob.controller.context import Context, Gate, JobMemory
from elasticjob.controller.loops import JobLoop
from elasticjob.controller.mirror import Mirror
from elasticjob.controller.reconcile import reconcile
from elasticjob.domain import Settings
from elasticjob.rendezvous_client import StoreClient

KEY = naming.job_key("ns", "train")


def job(version: str, uid: str = "u1") -> dict:
    return {"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob",
            "metadata": {"namespace": "ns", "name": "train", "uid": uid, "resourceVersion": version,
                         "creationTimestamp": "2026-11-23T00:00:00Z"}, "spec": {}}


def reconciled(mirrored: dict, written: dict) -> dict | None:
    """memory.written after one reconcile by a replica that may not act (so nothing is sent anywhere)."""
    mirror = Mirror()
    mirror.jobs.apply("ADDED", mirrored)
    gate = Gate()
    gate.active = False
    ctx = Context(kube=k8s.Kube(ApiClient(Configuration())), mirror=mirror, stores=StoreClient(b"k" * 32),
                  settings=Settings(), logger=logging.getLogger("test"), instance="t", gate=gate)
    loop = JobLoop(key=KEY, memory=JobMemory(written=written))
    asyncio.run(reconcile(ctx, loop))
    return loop.memory.written


@pytest.mark.parametrize(("mirrored", "written", "kept"), [
    ("7", "9", True),    # the watch has not delivered our write yet: plan from what we wrote
    ("9", "9", False),   # it has: the mirror's body is the same version
    ("12", "9", False),  # and newer since
])
def test_the_last_write_is_kept_until_the_watch_catches_up(mirrored, written, kept):
    assert (reconciled(job(mirrored), job(written)) is not None) is kept


def test_a_write_to_an_earlier_job_of_the_same_name_is_dropped():
    assert reconciled(job("3", uid="new"), job("9", uid="old")) is None
