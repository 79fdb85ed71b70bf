"""A job's template is the one Kueue charges: a template changed after admission runs no pod on that admission
(the job is requeued with a new Workload), and a pending Workload follows the template."""

from __future__ import annotations

import pytest
from factory import (
    NOW,
    SERVICE,
    creates,
    deletes,
    failed,
    job,
    observed,
    rdzv,
    running_status,
    template,
    with_kueue,
    worker,
)
from test_planner_queueing import ADMITTED, FLAVORS, PENDING, admission

from elasticjob import planner
from elasticjob.kueue import actions as kueue_actions
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import workloads
from elasticjob.kueue.status import admission as kueue_admission
from elasticjob.models import Phase

KUEUE = with_kueue(on=True)
QUEUED = {kueue_names.QUEUE_LABEL: "lq"}
SMALL = template(resources={"requests": {"cpu": "1"}})
BIG = template(resources={"requests": {"cpu": "64", "nvidia.com/gpu": "8"},
                          "limits": {"nvidia.com/gpu": "8"}})


def made_from(tmpl, conditions=ADMITTED, assigned=2):
    """The Workload the operator made for the job when its template was `tmpl`, as Kueue then holds it."""
    body = workloads.workload(job(labels=QUEUED, template=tmpl).ref, "lq", None)
    body["metadata"] |= {"uid": "uid-wl", "resourceVersion": "77", "generation": 1}
    body["status"] = {"conditions": list(conditions), **({"admission": admission(assigned)} if assigned else {})}
    return workloads.workload_view(body)


def plan(tmpl, pods, wl, suspend=False, status=None, labels=QUEUED):
    j = job(status or running_status(), labels=labels, template=tmpl, runPolicy={"suspend": suspend})
    return planner.plan(j, observed(pods, SERVICE, workload=wl, flavors=FLAVORS), NOW, KUEUE)


def test_the_template_a_workload_charges_is_recorded_on_it_and_in_status():
    wl = made_from(SMALL)
    assert wl.template_hash == workloads.template_hash(job(template=SMALL).ref.spec)
    result = plan(SMALL, [rdzv(), worker(0), worker(1)], wl)
    assert kueue_admission(result.status).template_hash == wl.template_hash
    assert kueue_admission(result.status).state == "Admitted"


@pytest.mark.parametrize("tmpl, replaced", [
    (SMALL, ["train-worker-1"]),  # the template Kueue charges: the failed worker is replaced
    (BIG, []),  # 64 CPUs and 8 GPUs on a 1-CPU admission: nothing is made of it
])
def test_a_template_changed_after_admission_makes_no_pod(tmpl, replaced):
    """Admitted with 1-CPU workers; the template is patched to 64 CPUs and 8 GPUs and a worker exits 1."""
    first = plan(tmpl, [rdzv(), worker(0), failed(1, exit_code=1)], made_from(SMALL))
    result = plan(tmpl, [rdzv(), worker(0)], made_from(SMALL), status=first.status.wire())
    made = [a.manifest for a in result.actions if isinstance(a, planner.CreateObject) and a.manifest["kind"] == "Pod"]
    assert sorted(p["metadata"]["name"] for p in made) == replaced
    for pod in made:
        assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}
    assert not [a for a in first.actions if isinstance(a, planner.CreateObject) and a.manifest["kind"] == "Pod"
                and tmpl is BIG]
    suspends = [a for a in result.actions if isinstance(a, planner.SetSuspend)]
    if tmpl is BIG:  # requeued as Kueue requeues a job that no longer matches its Workload
        (suspend,) = suspends
        assert suspend.suspend is True and suspend.event.type == "Warning"
        assert suspend.event.reason == "TemplateChanged" and "changed after Kueue admitted" in suspend.event.message
    else:
        assert suspends == []


def test_once_suspended_its_pods_stop_and_then_its_workload_is_deleted_for_a_new_one():
    wl = made_from(SMALL)
    stopping = plan(BIG, [rdzv(), worker(0), worker(1)], wl, suspend=True)
    assert deletes(stopping) == [("train-worker-0", None), ("train-worker-1", None)]  # the store once they are gone
    assert not [a for a in stopping.actions if isinstance(a, (planner.DeleteObject, planner.SetSuspend))]
    assert (stopping.status.phase, stopping.status.reason) == (Phase.QUEUED, "TemplateChanged")
    admitted = next(c for c in stopping.status.conditions if c.type == "Admitted")
    assert admitted.status == "False" and "requeued with the new template" in admitted.message

    gone = plan(BIG, [], wl, suspend=True, status=stopping.status.wire())
    (delete,) = [a for a in gone.actions if isinstance(a, planner.DeleteObject)]
    assert (delete.kind, delete.name, delete.uid, delete.resource_version) == ("Workload", wl.name, "uid-wl", "77")
    assert creates(gone) == [] and not [a for a in gone.actions if isinstance(a, planner.SetSuspend)]

    again = plan(BIG, [], None, suspend=True, status=gone.status.wire())
    (new,) = [a.manifest for a in again.actions if isinstance(a, planner.CreateObject)]
    assert new["kind"] == "Workload"
    assert workloads.workload_view(new).template_hash == workloads.template_hash(job(template=BIG).ref.spec)
    assert new["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "64"


def test_without_its_label_the_workload_is_kept_and_the_job_holds():
    result = plan(BIG, [], made_from(SMALL), suspend=True, labels={})
    assert not [a for a in result.actions if isinstance(a, (planner.DeleteObject, planner.CreateObject))]
    assert result.status.reason == "TemplateChanged" and "restore the template" in result.status.message


def test_a_workload_made_before_hashes_were_kept_is_taken_as_matching():
    body = workloads.workload(job(labels=QUEUED, template=SMALL).ref, "lq", None)
    del body["spec"]["podSets"][0]["template"]["metadata"]["annotations"]
    body["status"] = {"conditions": ADMITTED, "admission": admission(2)}
    result = plan(BIG, [rdzv(), worker(0)], workloads.workload_view(body))
    assert creates(result) == ["train-worker-1"]


def test_a_pending_workload_follows_the_template():
    result = plan(BIG, [], made_from(SMALL, PENDING, assigned=0), suspend=True, status={})
    (patch,) = [a for a in result.actions if isinstance(a, kueue_actions.PatchWorkload)]
    workers = patch.pod_sets[0]["template"]
    assert workers["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "64"
    assert workers["metadata"]["annotations"][workloads.TEMPLATE_HASH_ANNOTATION] == workloads.template_hash(
        job(template=BIG).ref.spec)


def test_a_port_protocol_the_schema_defaults_is_no_change_of_template():
    """A job stored before the CRD carried the pod template's schema reads back with `protocol: TCP` on its
    ports: the Workload made from it still charges the same template, and the job is not requeued."""
    before = template(ports=[{"containerPort": 8080}])
    after = template(ports=[{"containerPort": 8080, "protocol": "TCP"}])
    wl = made_from(before)
    assert wl.template_hash == workloads.template_hash(job(template=after).ref.spec)
    result = plan(after, [rdzv(), worker(0), worker(1)], wl)
    assert kueue_admission(result.status).state == "Admitted" and not deletes(result)
    udp = template(ports=[{"containerPort": 8080, "protocol": "UDP"}])
    assert workloads.template_hash(job(template=udp).ref.spec) != wl.template_hash
