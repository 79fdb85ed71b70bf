"""Gang scheduling: the PodGroup of either API at minReplicas, made before the workers, recreated when
minReplicas changes; how workers (and not the store) join it."""

from __future__ import annotations

import pytest
from factory import NOW, SERVICE, UID, creates, job, observed, rdzv, running_status, worker

from elasticjob import builders, domain, planner
from elasticjob.gang import podgroup
from elasticjob.gang.actions import PatchPodGroup
from elasticjob.gang.podgroup import COSCHEDULING_API, WORKLOAD_API, PodGroupView


def plan(j, pods, service=SERVICE, **seen):
    return planner.plan(j, observed(pods, service, **seen), NOW)


def created(result, kind):
    return [a.manifest for a in result.actions if isinstance(a, planner.CreateObject) and a.manifest["kind"] == kind]


def group(api=WORKLOAD_API, minimum=2, owner=UID, **fields):
    return PodGroupView(api, "train-workers", minimum, owner_uid=owner, uid="uid-pg", **fields)


WORKLOAD = {"gang": "Workload"}
COSCHEDULING = {"gang": "Coscheduling"}


@pytest.mark.parametrize("scheduling, api, spec", [
    (WORKLOAD, WORKLOAD_API, {"schedulingPolicy": {"gang": {"minCount": 2}}}),
    (COSCHEDULING, COSCHEDULING_API, {"minMember": 2}),
    ({"gang": "Coscheduling", "scheduleTimeoutSeconds": 60}, COSCHEDULING_API,
     {"minMember": 2, "scheduleTimeoutSeconds": 60}),
])
def test_a_gang_job_gets_its_pod_group_at_min_replicas_with_its_first_workers(scheduling, api, spec):
    result = plan(job(minReplicas=2, maxReplicas=4, replicas=3, scheduling=scheduling), [rdzv()])
    (pg,) = created(result, "PodGroup")
    assert pg["apiVersion"] == api and pg["spec"] == spec
    assert pg["metadata"]["name"] == "train-workers"
    assert pg["metadata"]["labels"] == {"elasticjob.dev/job-name": "train"}
    assert pg["metadata"]["ownerReferences"][0]["uid"] == UID
    # Objects are applied before pods: the group exists when its first member is created.
    assert creates(result) == ["train-worker-0", "train-worker-1", "train-worker-2"]
    assert [a.manifest["kind"] for a in builders_first(result)][0] == "PodGroup"


def builders_first(result):
    from elasticjob.controller.apply import waves

    early, late = waves(result.actions)
    return [a for a in early if isinstance(a, planner.CreateObject)] + late


def test_without_a_gang_no_pod_group_and_pods_join_nothing():
    result = plan(job(), [rdzv()])
    assert not created(result, "PodGroup")
    pod = created(result, "Pod")[0]
    assert "schedulingGroup" not in pod["spec"] and "schedulerName" not in pod["spec"]


def test_workload_api_workers_join_through_scheduling_group():
    result = plan(job(scheduling=WORKLOAD), [rdzv()], pod_group=group(minimum=1))
    assert not created(result, "PodGroup")
    pods = created(result, "Pod")
    assert pods and all(p["spec"]["schedulingGroup"] == {"podGroupName": "train-workers"} for p in pods)
    assert all("scheduling.x-k8s.io/pod-group" not in p["metadata"]["labels"] for p in pods)


def test_coscheduling_workers_carry_the_label_and_the_second_scheduler():
    result = plan(job(scheduling=COSCHEDULING), [rdzv()], pod_group=group(COSCHEDULING_API, 1))
    pods = created(result, "Pod")
    assert pods and all(p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "train-workers" for p in pods)
    assert all(p["spec"]["schedulerName"] == "scheduler-plugins-scheduler" for p in pods)
    assert all("schedulingGroup" not in p["spec"] for p in pods)


@pytest.mark.parametrize("scheduling, scheduler", [
    (COSCHEDULING, "scheduler-plugins-scheduler"),
    ({"gang": "Coscheduling", "schedulerName": "gang-scheduler"}, "gang-scheduler"),
    (WORKLOAD, None),
])
def test_the_store_is_outside_the_gang_but_on_the_workers_scheduler(scheduling, scheduler):
    result = plan(job(scheduling=scheduling), [], service=None)
    (store,) = created(result, "Pod")
    assert store["metadata"]["name"] == "train-rdzv"
    assert "scheduling.x-k8s.io/pod-group" not in store["metadata"]["labels"]
    assert "schedulingGroup" not in store["spec"]
    assert store["spec"].get("schedulerName") == scheduler


def test_the_templates_scheduler_is_kept_with_coscheduling_unless_one_is_named():
    tpl = {"spec": {"schedulerName": "my-coscheduler", "containers": [
        {"name": "worker", "image": "t", "command": ["torchrun"]}]}}
    assert podgroup.scheduler_name(job(scheduling=COSCHEDULING, template=tpl).ref.spec) == "my-coscheduler"


@pytest.mark.parametrize("have", [
    group(minimum=1),  # minReplicas went from 1 to 2
    group(minimum=3),
])
def test_an_upstream_group_with_another_minimum_is_made_again_once_no_worker_refers_to_it(have):
    j = job(running_status(), minReplicas=2, replicas=3, scheduling=WORKLOAD)
    # Workers exist: the group is protected (podgroup-protection finalizer) and their schedulingGroup is
    # immutable, so it stays; new workers join it.
    kept = plan(j, [rdzv(), worker(0), worker(1)], pod_group=have)
    assert not [a for a in kept.actions if isinstance(a, planner.DeleteObject)]
    assert creates(kept) == ["train-worker-2"]
    # No worker left (suspended and resumed, queued again): deleted, then made with the new minimum.
    result = plan(j, [rdzv()], pod_group=have)
    (deleted,) = [a for a in result.actions if isinstance(a, planner.DeleteObject)]
    assert (deleted.api_version, deleted.kind, deleted.name, deleted.uid) == (
        WORKLOAD_API, "PodGroup", "train-workers", "uid-pg")
    assert not created(result, "PodGroup") and creates(result) == []  # workers wait for the new group
    assert result.requeue_after <= 1
    again = plan(j, [rdzv()], pod_group=None)
    assert created(again, "PodGroup")[0]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2
    assert creates(again) == ["train-worker-0", "train-worker-1", "train-worker-2"]


def test_a_coscheduling_group_is_updated_in_place():
    j = job(running_status(), minReplicas=2, replicas=3, scheduling={"gang": "Coscheduling",
                                                                     "scheduleTimeoutSeconds": 30})
    result = plan(j, [rdzv(), worker(0), worker(1)], pod_group=group(COSCHEDULING_API, 1, timeout_seconds=60))
    (patch,) = [a for a in result.actions if isinstance(a, PatchPodGroup)]
    assert (patch.api_version, patch.name) == (COSCHEDULING_API, "train-workers")
    assert patch.patch == {"spec": {"minMember": 2, "scheduleTimeoutSeconds": 30}}
    assert not [a for a in result.actions if isinstance(a, planner.DeleteObject)]
    assert creates(result) == ["train-worker-2"]


@pytest.mark.parametrize("have", [
    group(owner="uid-of-an-earlier-job"),
    group(minimum=1, deleting=True),
])
def test_a_group_being_removed_or_left_by_an_earlier_job_is_waited_for(have):
    result = plan(job(minReplicas=2, scheduling=WORKLOAD), [rdzv()], pod_group=have)
    assert not created(result, "PodGroup") and creates(result) == []
    assert not [a for a in result.actions if isinstance(a, planner.DeleteObject)]
    assert result.requeue_after <= 2


def test_scale_up_and_replacements_join_the_same_group_without_touching_it():
    j = job(running_status(), minReplicas=2, maxReplicas=4, replicas=4, scheduling=COSCHEDULING)
    result = plan(j, [rdzv(), worker(0), worker(2)], pod_group=group(COSCHEDULING_API, 2))
    assert creates(result) == ["train-worker-1", "train-worker-3"]
    assert not created(result, "PodGroup")
    assert not [a for a in result.actions if isinstance(a, planner.DeleteObject)]


def test_observing_a_pod_group_of_either_api():
    upstream = podgroup.pod_group(job(scheduling=WORKLOAD).ref, podgroup.desired(job(scheduling=WORKLOAD).ref))
    upstream["metadata"].update(uid="u1")
    seen = podgroup.pod_group_view(upstream)
    assert (seen.api_version, seen.min_member, seen.owner_uid, seen.uid) == (WORKLOAD_API, 1, UID, "u1")
    cosched = {"apiVersion": COSCHEDULING_API, "metadata": {"name": "g", "deletionTimestamp": "now"},
               "spec": {"minMember": 3, "scheduleTimeoutSeconds": 10}}
    seen = podgroup.pod_group_view(cosched)
    assert (seen.min_member, seen.timeout_seconds, seen.deleting, seen.owner_uid) == (3, 10, True, None)


def test_placement_adds_to_the_template_without_dropping_its_own():
    tpl = {"spec": {"nodeSelector": {"pool": "a"}, "containers": [{"name": "worker", "image": "t",
                                                                      "command": ["torchrun"]}]}}
    ref = job(template=tpl).ref
    placement = domain.Placement(labels=(("x", "1"),), node_selector=(("gpu", "h100"),),
                                   tolerations=({"key": "gpu", "operator": "Exists"},))
    pod = builders.worker_pod(ref, 0, "e:1", 0, placement)
    assert pod["spec"]["nodeSelector"] == {"pool": "a", "gpu": "h100"}
    assert {"key": "gpu", "operator": "Exists"} in pod["spec"]["tolerations"]
    assert pod["metadata"]["labels"]["x"] == "1"
    assert "gpu" not in (ref.spec.template["spec"]["nodeSelector"])
