"""The chart's admission policies for Kueue, through the real API server (no operator: each job stays as the
test writes it): the template of an admitted job is fixed unless it is suspended, a queue required of every job,
a default queue given to a job created without one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jobapi import GROUP, PLURAL, VERSION, create, job_manifest
from kubernetes import client

from helpers import api_refusal as attempt
from helpers import wait_for
from kueue_support import queued

BIG = {"requests": {"cpu": "64", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}


@contextmanager
def policies(kube, namespace: str, values: dict[str, Any], suffix: str) -> Iterator[None]:
    """The chart's ValidatingAdmissionPolicy (and binding) or MutatingAdmissionPolicy named `...suffix`,
    bound to this test's namespace only."""
    import chart_rbac

    values = {"watch": {"allNamespaces": False, "namespaces": [namespace]}, **values}
    docs = [d for d in chart_rbac.render(values, f"p{namespace[-6:]}", namespace)
            if "AdmissionPolicy" in d["kind"] and d["metadata"]["name"].endswith(suffix)]
    admissions = client.AdmissionregistrationV1Api(kube)
    made: list[Callable[[], object]] = []
    try:
        for doc in docs:  # the policy, then its binding
            kind = "mutating" if doc["kind"].startswith("Mutating") else "validating"
            binding = "_binding" if doc["kind"].endswith("Binding") else ""
            getattr(admissions, f"create_{kind}_admission_policy{binding}")(doc)
            name = doc["metadata"]["name"]
            made.append(lambda k=kind, b=binding, n=name: getattr(admissions, f"delete_{k}_admission_policy{b}")(n))
        assert len(docs) == 2, [d["metadata"]["name"] for d in docs]
        yield
    finally:
        for delete in reversed(made):
            delete()


def patch(api, namespace: str, name: str, body: dict) -> Callable[[], object]:
    return lambda: api[0].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body)


def test_the_template_of_an_admitted_job_changes_only_while_it_is_suspended(kube, api, namespace, crds_installed):
    with policies(kube, namespace, {}, "-template-fixed-while-admitted"):
        for name in ("running", "paused"):
            create(api, namespace, queued(job_manifest(name)))
            # What the operator writes once Kueue admits the job (status is written only through the subresource).
            api[0].patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {
                "status": {"admission": {"workload": f"elasticjob-{name}", "state": "Admitted"}}})
        template = api[0].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "running")["spec"]["template"]

        def bigger(cpus: int) -> dict:
            template["spec"]["containers"][0]["resources"] = {**BIG, "requests": {**BIG["requests"], "cpu": str(cpus)}}
            return {"spec": {"template": template}}

        # Policies take effect once the API server has loaded them: retry until the change is refused (a new
        # template each time: one let through before that is the template now).
        tries = iter(range(64, 10_000))
        refused = wait_for(lambda: attempt(patch(api, namespace, "running", bigger(next(tries)))), 30,
                           "the template change refused", until=lambda exc: exc is not None)
        assert refused.status == 403 and "suspend the job" in refused.body, refused.body
        # Suspended by the same change, or before it: accepted (the operator then requeues it).
        assert attempt(patch(api, namespace, "running", {"spec": {"template": template,
                                                                   "runPolicy": {"suspend": True}}})) is None
        assert attempt(patch(api, namespace, "paused", {"spec": {"runPolicy": {"suspend": True}}})) is None
        assert attempt(patch(api, namespace, "paused", {"spec": {"template": template}})) is None
        # Other changes of an admitted job are its own business.
        assert attempt(patch(api, namespace, "running", {"spec": {"runPolicy": {"suspend": False}, "replicas": 1}})) \
            is None


def test_a_queue_is_required_of_every_new_job(kube, api, namespace, crds_installed):
    create(api, namespace, job_manifest("before"))  # made before the policy: may still be updated
    with policies(kube, namespace, {"kueue": {"requireQueueName": True}}, "-queue-name-required"):
        tries = iter(range(10_000))
        refused = wait_for(lambda: attempt(lambda: create(api, namespace, job_manifest(f"plain-{next(tries)}"))),
                           30, "a job without a queue refused", until=lambda exc: exc is not None)
        assert refused.status == 403 and "kueue.x-k8s.io/queue-name" in refused.body, refused.body
        create(api, namespace, queued(job_manifest("labelled")))
        assert attempt(patch(api, namespace, "labelled", {"metadata": {"labels": {
            "kueue.x-k8s.io/queue-name": None}}})).status == 403
        assert attempt(patch(api, namespace, "before", {"spec": {"replicas": 1}})) is None


def test_a_default_queue_labels_a_job_created_without_one(kube, api, namespace, crds_installed):
    values = {"kueue": {"mode": "on", "defaultQueueName": "team-q"}}
    with policies(kube, namespace, values, "-queued-jobs-start-suspended"):
        tries = iter(range(10_000))
        made = wait_for(lambda: create(api, namespace, job_manifest(f"plain-{next(tries)}")), 30,
                        "a job given the default queue",
                        until=lambda job: (job["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name"))
        assert made["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
        assert made["spec"]["runPolicy"]["suspend"] is True
        own = create(api, namespace, queued(job_manifest("own"), queue="other"))
        assert own["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "other"
        assert own["spec"]["runPolicy"]["suspend"] is True
