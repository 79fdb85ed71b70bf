"""A stored spec the model refuses fails the job once, visibly, and is tried again only when the spec changes;
an API error makes the reconcile fail for the loop to retry with backoff."""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration
from pydantic import ValidationError

import helpers
from elasticjob import k8s, naming
from elasticjob.controller import unparsable
from elasticjob.controller.context import Context
from elasticjob.controller.loops import Failed, JobLoop
from elasticjob.controller.mirror import Mirror
from elasticjob.controller.reconcile import reconcile
from elasticjob.domain import Settings
from elasticjob.models import ElasticJobSpec, ElasticJobStatus, Phase
from elasticjob.rendezvous_client import StoreClient

KEY = naming.job_key("ns", "train")
until = functools.partial(helpers.until, timeout=2.0)


class Server(k8s.Kube):
    """The API server's side of the calls this reconcile makes: the job's status patches (with their
    resourceVersion precondition) and Events."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(ApiClient(Configuration()))
        self.job, self.patches, self.events = job, 0, []
        self.refuse: k8s.KubeError | None = None

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.job)

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any],
                               resource_version: str) -> dict[str, Any]:
        if self.refuse:
            raise self.refuse
        if resource_version != self.job["metadata"]["resourceVersion"]:
            raise k8s.Conflict(409, "Conflict", "the object has been modified")
        self.patches += 1
        self.edit(status=status)
        return copy.deepcopy(self.job)

    async def post_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def edit(self, **fields: Any) -> None:
        """A write: a new resourceVersion, and a new generation when the spec changes."""
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if "spec" in fields:
            meta["generation"] += 1
        self.job.update(copy.deepcopy(fields))


def stored(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob",
            "metadata": {"namespace": "ns", "name": "train", "uid": "u1", "resourceVersion": "10", "generation": 1,
                         "creationTimestamp": "2026-11-23T00:00:00Z"}, "spec": spec}


def context(server: Server) -> tuple[Context, Mirror]:
    mirror = Mirror()
    mirror.jobs.apply("ADDED", server.job)
    ctx = Context(kube=server, mirror=mirror, stores=StoreClient(b"k" * 32), settings=Settings(),
                  logger=logging.getLogger("test"), instance="t")
    return ctx, mirror


TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "t", "command": ["torchrun"]}]}}


def test_an_unparsable_spec_fails_the_job_once_until_its_spec_changes():
    async def scenario():
        server = Server(stored({"minReplicas": "two", "maxReplicas": 2, "template": TEMPLATE}))
        ctx, mirror = context(server)
        loop = JobLoop(key=KEY)
        assert await reconcile(ctx, loop) == float("inf")  # nothing to retry: only an edit wakes it
        await until(lambda: len(server.events) == 1, what="the Warning Event")
        status = server.job["status"]
        assert (status["phase"], status["reason"], status["observedGeneration"]) == ("Failed", "InvalidSpec", 1)
        assert status["message"].startswith("spec does not parse: spec.minReplicas: Input should be a valid integer")
        assert [(c["type"], c["reason"]) for c in status["conditions"] if c["status"] == "True"] == [
            ("Failed", "InvalidSpec")]
        event = server.events[0]
        assert (event["type"], event["reason"], event["message"]) == ("Warning", "InvalidSpec", status["message"])

        mirror.jobs.apply("MODIFIED", server.job)  # the watch brings the write back; and a resync later
        for _ in range(2):
            assert await reconcile(ctx, loop) == float("inf")
        assert (server.patches, len(server.events)) == (1, 1), "failed once: no write, no Event again"

        server.edit(spec={"minReplicas": 1, "maxReplicas": "three", "template": TEMPLATE})  # still wrong
        mirror.jobs.apply("MODIFIED", server.job)
        assert await reconcile(ctx, loop) == float("inf")
        await until(lambda: len(server.events) == 2, what="the second Warning Event")
        status = server.job["status"]
        assert server.patches == 2 and status["observedGeneration"] == 2
        assert status["message"].startswith("spec does not parse: spec.maxReplicas:")
    asyncio.run(scenario())


def test_a_job_that_finished_before_its_spec_stopped_parsing_keeps_how_it_ended():
    async def scenario():
        server = Server(stored({"minReplicas": "two"}))
        server.job["status"] = {"phase": "Succeeded", "reason": "Succeeded", "observedGeneration": 1}
        ctx, _ = context(server)
        assert await reconcile(ctx, JobLoop(key=KEY)) == float("inf")
        assert server.patches == 0 and server.job["status"]["phase"] == "Succeeded"
    asyncio.run(scenario())


def test_an_api_error_fails_the_reconcile_for_the_loop_to_back_off():
    async def scenario():
        server = Server(stored({"minReplicas": "two"}))
        server.refuse = k8s.KubeError(503, "Service Unavailable", "etcd is away")
        ctx, _ = context(server)
        with pytest.raises(Failed, match="503") as raised:
            await reconcile(ctx, JobLoop(key=KEY))
        assert raised.value.log.extra["k8s_ref"]["name"] == "train", "logged as a line about the job"
    asyncio.run(scenario())


def refusal(spec: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        ElasticJobSpec.model_validate(spec)
    return caught.value


@pytest.mark.parametrize(("spec", "said"), [
    ({"maxReplicas": 2}, "spec does not parse: spec.template: Field required"),
    ({"maxReplicas": 2, "template": TEMPLATE, "runPolicy": {"suspend": "maybe"}},
     "spec does not parse: spec.runPolicy.suspend: Input should be a valid boolean, unable to interpret input"),
    ({"minReplicas": "a", "maxReplicas": "b", "template": TEMPLATE,
      "runPolicy": {"suspend": "c", "activeDeadlineSeconds": "d"}},
     "spec does not parse: spec.minReplicas: Input should be a valid integer, unable to parse string as an "
     "integer; spec.maxReplicas: Input should be a valid integer, unable to parse string as an integer; "
     "spec.runPolicy.suspend: Input should be a valid boolean, unable to interpret input (and 1 more)"),
])
def test_the_message_names_each_field_and_what_is_wrong(spec, said):
    assert unparsable.message(refusal(spec)) == said


def test_each_error_is_cut_short():
    """A validator's own message can quote what it was given."""
    long = ValidationError.from_exception_data("ElasticJobSpec", [
        {"type": "value_error", "loc": ("template",), "input": {}, "ctx": {"error": ValueError("x" * 5000)}}])
    said = unparsable.message(long)
    assert said.startswith("spec does not parse: spec.template: Value error, xxx") and said.endswith("x…")
    assert len(said) == len("spec does not parse: spec.template: ") + unparsable.ERROR_CHARS


@pytest.mark.parametrize(("loc", "path"), [
    (("minReplicas",), "spec.minReplicas"),
    (("template", "spec", "containers", 0, "image"), "spec.template.spec.containers[0].image"),
])
def test_the_field_path_is_the_one_a_person_edits(loc, path):
    assert unparsable.field_path(loc) == path


@pytest.mark.parametrize(("phase", "reason", "generation", "done"), [
    (Phase.PENDING, "Waiting", 1, False),   # running or about to: fail it
    (Phase.FAILED, "InvalidSpec", 1, True),   # failed for this generation already
    (Phase.FAILED, "InvalidSpec", 0, False),  # the spec changed since: try it again
    (Phase.SUCCEEDED, "Succeeded", 0, True),  # it ended before the spec stopped parsing
])
def test_when_there_is_nothing_more_to_do(phase, reason, generation, done):
    status = ElasticJobStatus(phase=phase, reason=reason, observed_generation=generation)
    assert unparsable.reported(status, 1) is done
