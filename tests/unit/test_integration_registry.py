"""The controller's side of the integration seam (elasticjob/integrations.py): the integrations' watches join the
controller's, their events go to their own caches and wake the jobs they name, what a reconcile observes
carries one view per integration, in the registry's order, and their objects are created where they say."""

from __future__ import annotations

import asyncio
import logging

import pytest
from factory import NOW, UID, job, observed, rdzv, spec, with_kueue
from kubernetes.client import ApiClient, Configuration

from elasticjob import k8s, naming, planner
from elasticjob.controller import observing, watch
from elasticjob.controller.context import Context, JobMemory
from elasticjob.controller.mirror import Mirror
from elasticjob.domain import JobRef
from elasticjob.gang.planning import Gang
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import settings as kueue_settings
from elasticjob.kueue.admission import Kueue
from elasticjob.rendezvous_client import StoreClient

CORE = {"elasticjobs", "pods", "services", "endpointslices"}
REF = JobRef(namespace="ns", name="train", uid=UID, spec=spec())


def context(kueue: bool) -> Context:
    return Context(kube=k8s.Kube(ApiClient(Configuration())), mirror=Mirror(), stores=StoreClient(b"k" * 32),
                   settings=with_kueue(on=kueue), logger=logging.getLogger("test"), instance="t")


def workload(name: str, owner: str = UID) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {naming.JOB_LABEL: "train"},
                         "ownerReferences": [{"uid": owner, "controller": True}]},
            "spec": {"queueName": "lq", "podSets": []}}


@pytest.mark.parametrize("kueue, watched", [
    (False, []),
    (True, [("resourceflavors", None), ("workloads", "a"), ("workloads", "b")]),
])
def test_the_integrations_watches_join_the_controllers(kueue, watched):
    sources = watch.sources(context(kueue), ["a", "b"])
    assert sorted((s.kind, s.namespace) for s in sources if s.kind not in CORE) == watched
    assert sorted({s.kind for s in sources} & CORE) == sorted(CORE)


def test_a_workload_event_goes_to_kueues_cache_and_wakes_its_job():
    ctx = context(True)
    assert ctx.cache("workloads").apply("ADDED", workload("train-wl")) == {("ns", "train")}
    assert ctx.cache("pods") is ctx.mirror.pods
    with pytest.raises(KeyError):
        ctx.cache("workloads-of-nobody")


def test_a_reconcile_observes_one_view_per_integration_in_the_registrys_order():
    ctx = context(True)
    ctx.cache("workloads").apply("ADDED", workload("train-wl"))
    ctx.cache("workloads").apply("ADDED", workload("other-wl", owner="another-job"))
    views = asyncio.run(observing.integrations(ctx, JobMemory(), REF))
    assert [type(v) for v in views] == [Gang, Kueue]
    kueue = views[1]
    assert isinstance(kueue, Kueue) and [w.name for w in kueue.workloads] == ["train-wl"]


def test_without_kueue_its_view_is_empty_and_still_gates():
    views = asyncio.run(observing.integrations(context(False), JobMemory(), REF))
    assert views[1] == Kueue()


@pytest.mark.parametrize("scheduling, labels, kind, plural", [
    ({"gang": "Workload"}, {}, "PodGroup", "podgroups"),
    (None, {kueue_names.QUEUE_LABEL: "lq"}, "Workload", "workloads"),
])
def test_an_integrations_object_is_created_under_the_plural_it_names(scheduling, labels, kind, plural):
    """The client knows the core kinds' collections only: an integration's own kind is created where the
    integration says, so a new integration needs no line in k8s.py."""
    fields = {"scheduling": scheduling} if scheduling else {}
    suspended = {"runPolicy": {"suspend": True}} if labels else {}
    j = job(labels=labels, **fields, **suspended)
    result = planner.plan(j, observed([] if labels else [rdzv()]), NOW, with_kueue(on=True))
    (made,) = [a for a in result.actions if isinstance(a, planner.CreateObject) and a.manifest["kind"] == kind]
    assert made.plural == plural
    assert k8s.PLURALS.get(kind) is None


def test_kueues_flags_are_its_own_and_reach_its_settings():
    from elasticjob import cli

    config = cli.run_config(cli.parse_args(["run", "--kueue", "--kueue-slices", "off", "--require-queue-name"]))
    assert kueue_settings.of(config.settings) == kueue_settings.KueueSettings(on=True, mode="on", slices=False,
                                                                               require_queue_name=True)
    assert kueue_settings.of(cli.run_config(cli.parse_args(["run"])).settings) == kueue_settings.KueueSettings()


class Toy:
    """A third integration with a flag of its own: a package's class and one registry line, nothing else."""

    name = "toy"

    @staticmethod
    def add_arguments(run):
        run.add_argument("--toy-level", type=int, default=1)

    @staticmethod
    def from_arguments(args):
        return {"level": args.toy_level}


def test_a_new_integrations_flags_need_only_its_class_and_the_registry_line(monkeypatch):
    from elasticjob import cli, integrations

    monkeypatch.setattr(integrations, "INTEGRATIONS", (*integrations.INTEGRATIONS, Toy))
    config = cli.run_config(cli.parse_args(["run", "--toy-level", "3", "--kueue", "off"]))
    assert config.settings.integration("toy") == {"level": 3}
    assert kueue_settings.of(config.settings).mode == "off"


def test_the_cores_settings_name_no_integration():
    import dataclasses

    from elasticjob.domain import Settings

    fields = {f.name for f in dataclasses.fields(Settings)}
    assert not {f for f in fields if "kueue" in f or "gang" in f}, fields


def test_an_integration_has_the_core_and_only_the_optional_parts_it_uses():
    """The gang starts nothing, watches nothing and has no status of its own: it implements none of those."""
    from elasticjob import integrations

    def parts(integration) -> set[str]:
        return {p.__name__ for p in (integrations.Starts, integrations.Watches, integrations.Acts,
                                     integrations.Follows, integrations.Reports) if isinstance(integration, p)}

    gang, kueue = integrations.build()
    assert (parts(gang), parts(kueue)) == ({"Acts", "Follows"}, {"Starts", "Watches", "Acts", "Follows", "Reports"})
    assert [part.key for part in integrations.status_parts()] == ["admission"]


class Core:
    """An integration with the core alone: a memory and a read."""

    name = "core-only"

    def memory(self):
        return None

    async def read(self, kube, memory, ref, settings):
        return Gang(None)


def test_an_integration_with_the_core_alone_runs_beside_the_others():
    ctx = context(kueue=True)
    ctx.integrations = (Core(), *ctx.integrations)
    assert ctx.cache("workloads") is ctx.integrations[2].caches["workloads"]
    assert ctx.cache("pods") is ctx.mirror.cache("pods")
    assert [s.kind for s in watch.sources(ctx, ["ns"])].count("workloads") == 1
