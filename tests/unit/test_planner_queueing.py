"""Admission by Kueue, decision by decision: suspended until admitted, a Workload with the job's pod sets,
the admitted count and flavors applied, eviction stops the pods and releases the quota without a charge,
the end marks the Workload Finished."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import (
    NOW,
    SERVICE,
    UID,
    condition,
    creates,
    deletes,
    failed,
    job,
    observed,
    rdzv,
    running_status,
    with_kueue,
    worker,
)

from elasticjob import planner
from elasticjob.domain import Settings
from elasticjob.kueue import actions as kueue_actions
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import workloads
from elasticjob.kueue.status import admission as kueue_admission
from elasticjob.kueue.workloads import FlavorView, Priority

KUEUE = with_kueue(on=True)
CLAMPED = with_kueue(on=True, slices=False)  # Kueue without workload slices: the admitted count is a cap
QUEUED = {kueue_names.QUEUE_LABEL: "lq"}
WL = "elasticjob-train-e0019"  # what Kueue's GetWorkloadNameForOwnerWithGVK makes of (train, UID), run in Go
FLAVORS = {"gpu-a": FlavorView("gpu-a", (("pool", "a100"),), ({"key": "gpu", "operator": "Exists",
                                                                "effect": "NoSchedule"},))}
OLD = "2026-01-01T11:00:00Z"


def cond(kind, status, reason="", message=""):
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": OLD,
            "observedGeneration": 1}


def workload(conditions=(), admission=None, workers=(2, 1), **extra):
    """A Workload as the API server sends it, seen through workloads.workload_view."""
    pod_sets = [{"name": "workers", "count": workers[0], **({"minCount": workers[1]} if workers[1] else {})},
                {"name": "store", "count": 1}]
    status = {"conditions": list(conditions), **extra}
    if admission is not None:
        status["admission"] = admission
    body = {"metadata": {"name": WL, "namespace": "ml", "uid": "uid-wl", "resourceVersion": "77", "generation": 1,
                         "ownerReferences": [{"controller": True, "uid": UID}]},
            "spec": {"queueName": "lq", "podSets": pod_sets}, "status": status}
    return workloads.workload_view(body)


def admission(workers=2, flavor="gpu-a"):
    return {"clusterQueue": "cq", "podSetAssignments": [
        {"name": "workers", "count": workers, "flavors": {"cpu": flavor, "nvidia.com/gpu": flavor}},
        {"name": "store", "count": 1, "flavors": {"cpu": flavor}}]}


ADMITTED = [cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted")]
PENDING = [cond("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set workers: insufficient "
                "unused quota for cpu in flavor gpu-a, 1 more needed")]
PREEMPTED = ADMITTED + [cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due "
                             "to prioritization in the ClusterQueue"),
                        cond("Preempted", "True", "InClusterQueue", "Preempted to accommodate a workload")]


def plan(j, pods, service=SERVICE, settings=KUEUE, **seen):
    seen.setdefault("flavors", FLAVORS)
    return planner.plan(j, observed(pods, service, **seen), NOW, settings)


def kueue_job(status=None, suspend=False, **fields):
    fields.setdefault("runPolicy", {"suspend": suspend})
    return job(status, labels=QUEUED, **fields)


def actions(result, kind):
    return [a for a in result.actions if isinstance(a, kind)]


def created(result, kind):
    return [a.manifest for a in actions(result, planner.CreateObject) if a.manifest["kind"] == kind]


# --- not Kueue's -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [KUEUE, Settings(), with_kueue(mode="off")])
def test_jobs_kueue_does_not_manage_run_at_once(settings):
    result = plan(job(), [rdzv()], settings=settings)
    assert creates(result) == ["train-worker-0", "train-worker-1"]
    assert not actions(result, planner.SetSuspend) and kueue_admission(result.status) is None


# --- queued -----------------------------------------------------------------------------------------------


def test_a_new_queued_job_is_suspended_before_anything_is_created():
    result = plan(kueue_job(), [], service=None)
    assert actions(result, planner.SetSuspend) == [actions(result, planner.SetSuspend)[0]]
    assert actions(result, planner.SetSuspend)[0].suspend is True
    assert not actions(result, planner.CreateObject) and not actions(result, planner.DeletePod)
    assert planner.spec_changes(result.actions)[0] == {"runPolicy": {"suspend": True}}


def test_a_suspended_job_gets_its_workload_and_waits_queued():
    result = plan(kueue_job(suspend=True, minReplicas=2, maxReplicas=4, replicas=3), [], service=None)
    (wl,) = created(result, "Workload")
    assert created(result, "Pod") == [] and created(result, "Service") == []
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["metadata"]["name"] == WL
    assert wl["metadata"]["labels"] == {"elasticjob.dev/job-name": "train", "kueue.x-k8s.io/job-uid": UID}
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID and wl["metadata"]["ownerReferences"][0]["controller"]
    assert wl["spec"]["queueName"] == "lq" and "priorityClassRef" not in wl["spec"]
    workers, store = wl["spec"]["podSets"]
    assert (workers["name"], workers["count"], workers["minCount"]) == ("workers", 3, 2)
    assert workers["template"]["spec"]["containers"][0]["name"] == "worker"
    assert (store["name"], store["count"], "minCount" in store) == ("store", 1, False)
    assert store["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert (result.status.phase, result.status.reason) == ("Queued", "Queued")
    assert kueue_admission(result.status).state == "Queued" and kueue_admission(result.status).workload == WL
    assert condition(result, "Admitted") == "False"
    assert [e.reason for e in result.events] == ["Queued"]


def test_without_room_for_partial_admission_no_min_count():
    wl = created(plan(kueue_job(suspend=True, minReplicas=2, maxReplicas=2, replicas=2), []), "Workload")[0]
    assert "minCount" not in wl["spec"]["podSets"][0]


def test_the_workload_waits_until_no_pod_of_the_job_is_left():
    result = plan(kueue_job(suspend=True), [rdzv(), worker(0, deleting=True)])
    assert not created(result, "Workload")
    assert deletes(result) == []  # the store goes once the workers are gone: their agents may ask it
    result = plan(kueue_job(suspend=True), [rdzv()])
    assert not created(result, "Workload")
    assert deletes(result) == [("train-rdzv", None)]


@pytest.mark.parametrize("seen, ref, value", [
    (Priority((("group", "scheduling.k8s.io"), ("kind", "PriorityClass"), ("name", "high")), 1000),
     {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}, 1000),
    (Priority((("group", "kueue.x-k8s.io"), ("kind", "WorkloadPriorityClass"), ("name", "urgent")), 5),
     {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"}, 5),
])
def test_the_workload_carries_the_priority_its_class_gives(seen, ref, value):
    (wl,) = created(plan(kueue_job(suspend=True), [], priority=seen), "Workload")
    assert wl["spec"]["priorityClassRef"] == ref and wl["spec"]["priority"] == value


def test_a_missing_priority_class_is_shown_and_no_workload_made():
    result = plan(kueue_job(suspend=True), [], priority=Priority(problem="PriorityClass high not found"))
    assert not created(result, "Workload")
    assert (result.status.phase, result.status.reason) == ("Queued", "InvalidPriority")
    assert "PriorityClass high not found" in result.status.message


def test_a_pending_workload_shows_kueues_words():
    result = plan(kueue_job(suspend=True), [], workload=workload(PENDING))
    assert not actions(result, planner.CreateObject) and not actions(result, kueue_actions.PatchWorkload)
    assert (result.status.phase, result.status.reason) == ("Queued", "Queued")
    assert "insufficient unused quota for cpu" in result.status.message
    assert kueue_admission(result.status).message == result.status.message


RESERVED_NOT_ADMITTED = [cond("QuotaReserved", "True", "QuotaReserved"),
                         cond("Admitted", "False", "UnsatisfiedChecks", "waiting for admission checks")]


@pytest.mark.parametrize("conditions, patched", [(PENDING, True), (RESERVED_NOT_ADMITTED, False)])
def test_a_pending_workload_follows_the_spec_but_one_holding_quota_does_not(conditions, patched):
    wl = workload(conditions, admission(2) if conditions is RESERVED_NOT_ADMITTED else None, workers=(2, 1))
    result = plan(kueue_job(suspend=True, replicas=3), [], workload=wl)
    patches = actions(result, kueue_actions.PatchWorkload)
    assert bool(patches) == patched  # Kueue's pod sets are immutable while they hold quota
    assert (result.status.phase, result.status.reason) == ("Queued", "Queued")
    if patched:
        (patch,) = patches
        assert (patch.name, patch.resource_version, patch.queue_name) == (WL, "77", "lq")
        assert [(p["name"], p["count"], p.get("minCount")) for p in patch.pod_sets] == [
            ("workers", 3, 1), ("store", 1, None)]


def test_a_job_someone_unsuspends_before_admission_is_suspended_again():
    result = plan(kueue_job(suspend=False), [rdzv(), worker(0)], workload=workload(PENDING))
    assert [a.suspend for a in actions(result, planner.SetSuspend)] == [True]
    assert not created(result, "Pod")


# --- admitted ---------------------------------------------------------------------------------------------


def test_admission_unsuspends_the_job_with_one_event():
    result = plan(kueue_job(suspend=True), [], workload=workload(ADMITTED, admission(2)))
    (resume,) = actions(result, planner.SetSuspend)
    assert resume.suspend is False
    assert resume.event.reason == "Admitted" and "ClusterQueue cq: 2 workers (gpu-a)" in resume.event.message
    assert not actions(result, planner.CreateObject)


def test_admitted_pods_get_the_flavors_node_labels_and_tolerations():
    result = plan(kueue_job(), [], workload=workload(ADMITTED, admission(2)))
    pods = {p["metadata"]["name"]: p for p in created(result, "Pod")}
    assert sorted(pods) == ["train-rdzv", "train-worker-0", "train-worker-1"]
    for name, pod_set in (("train-worker-0", "workers"), ("train-rdzv", "store")):
        pod = pods[name]
        assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
        assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == pod_set
    status = kueue_admission(result.status)
    assert (status.state, status.cluster_queue, status.workers) == ("Admitted", "cq", 2)
    assert status.flavors == {"cpu": "gpu-a", "nvidia.com/gpu": "gpu-a"}
    assert condition(result, "Admitted") == "True"
    assert result.status.phase == "Pending"


@pytest.mark.parametrize("replicas, assigned, want", [
    (3, 2, ["train-worker-0", "train-worker-1"]),  # partial admission: the count Kueue gave
    (2, 3, ["train-worker-0", "train-worker-1"]),  # scaled down within the admitted count: at once
])
def test_workers_are_capped_at_the_admitted_count(replicas, assigned, want):
    j = kueue_job(running_status(), minReplicas=1, maxReplicas=3, replicas=replicas)
    result = plan(j, [rdzv()], workload=workload(ADMITTED, admission(assigned), workers=(assigned, 1)),
                  settings=CLAMPED)
    assert creates(result) == want
    assert result.status.desired_replicas == min(replicas, assigned)
    if replicas > assigned:
        assert f"replicas {replicas} exceeds the {assigned} workers Kueue admitted" in result.status.message


def test_a_scale_down_within_the_admitted_count_takes_effect_at_once():
    j = kueue_job(running_status(), replicas=1)
    result = plan(j, [rdzv(), worker(0), worker(1)], workload=workload(ADMITTED, admission(2)))
    assert deletes(result) == [("train-worker-1", None)]


def test_an_assigned_flavor_not_yet_seen_holds_the_pods():
    result = plan(kueue_job(), [], workload=workload(ADMITTED, admission(2, "new-flavor")))
    assert not created(result, "Pod")
    assert "ResourceFlavor new-flavor" in result.status.message and result.requeue_after <= 2


# --- evicted ----------------------------------------------------------------------------------------------



def test_a_preemption_opens_one_incident_in_the_ledger():
    """Kueue took the quota back: the downtime ledger books a Preemption once, when the admission turns so."""
    pods = [rdzv(), worker(0), worker(1)]
    training = running_status(goodput={"since": "2026-01-01T11:00:00.000Z"})  # the ledger runs since its start
    first = plan(kueue_job(training, suspend=True), pods, workload=workload(PREEMPTED, admission(2)))
    opened = first.status.goodput.open_incident if first.status.goodput else None
    assert opened is not None and (opened.kind, opened.reason) == ("Preemption", "Preempted")
    again = plan(kueue_job(first.status.model_dump(by_alias=True, exclude_none=True), suspend=True), pods,
                 workload=workload(PREEMPTED, admission(2)))
    assert again.status.goodput.open_incident.start_time == opened.start_time  # the same one, not a second


def test_an_evicted_job_is_suspended_first():
    result = plan(kueue_job(running_status()), [rdzv(), worker(0), worker(1)],
                  workload=workload(PREEMPTED, admission(2)))
    assert [a.suspend for a in actions(result, planner.SetSuspend)] == [True]
    assert not actions(result, planner.DeletePod) and not actions(result, kueue_actions.ApplyWorkloadStatus)


def test_a_preempted_job_stops_its_pods_without_counting_a_failure():
    pods = [rdzv(), worker(0), failed(1, exit_code=143)]
    status = running_status(restarts=1)
    result = plan(kueue_job(status, suspend=True), pods, workload=workload(PREEMPTED, admission(2)))
    assert deletes(result) == [("train-worker-0", None), ("train-worker-1", None)]  # the store once they are gone
    assert not actions(result, kueue_actions.ApplyWorkloadStatus)  # the quota goes once the pods are gone
    assert (result.status.phase, result.status.reason) == ("Queued", "Preempted")
    assert result.status.restarts == 1 and result.status.last_failures == [] and result.status.counted_failures == []
    assert kueue_admission(result.status).state == "Preempted"
    assert "Preempted to accommodate a workload" in result.status.message
    assert result.status.rendezvous.ready is False  # the store went on purpose: not a lost store later
    assert "Preempted" in [e.reason for e in result.events]


def test_once_the_pods_are_gone_the_quota_is_released_as_kueues_integrations_do():
    wl = workload(PREEMPTED, admission(2), requeueState={"count": 1}, resourceRequests=[{"name": "workers"}])
    result = plan(kueue_job(running_status(), suspend=True), [], workload=wl)
    (release,) = actions(result, kueue_actions.ApplyWorkloadStatus)
    assert release.name == WL
    body = release.body
    assert body["metadata"] == {"name": WL, "namespace": "ml", "uid": "uid-wl", "resourceVersion": "77"}
    status = body["status"]
    assert "admission" not in status  # applied as kueue-admission without it: removed
    conds = {c["type"]: c for c in status["conditions"]}
    stamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (conds["QuotaReserved"]["status"], conds["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert conds["QuotaReserved"]["message"].startswith("Preempted to accommodate")
    assert conds["QuotaReserved"]["lastTransitionTime"] == stamp
    assert (conds["Admitted"]["status"], conds["Admitted"]["reason"]) == ("False", "NoReservation")
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")
    assert conds["Evicted"] == cond("Evicted", "True", "Preempted", PREEMPTED[2]["message"])  # kept as it was
    assert conds["Preempted"]["status"] == "True"
    assert status["requeueState"] == {"count": 1} and status["resourceRequests"] == [{"name": "workers"}]
    assert release.event.reason == "QuotaReleased"


def test_a_deactivated_workload_is_not_requeued():
    wl = workload(ADMITTED + [cond("Evicted", "True", "Deactivated", "The workload is deactivated")], admission(2))
    result = plan(kueue_job(suspend=True), [], workload=wl)
    (release,) = actions(result, kueue_actions.ApplyWorkloadStatus)
    conds = {c["type"]: c for c in release.body["status"]["conditions"]}
    assert conds["Requeued"]["status"] == "False"
    assert (result.status.reason, kueue_admission(result.status).state) == ("Evicted", "Evicted")


def test_a_released_workload_waits_preempted_then_resumes_when_admitted_again():
    released = workload([cond("QuotaReserved", "False", "Pending", "Preempted to accommodate"),
                         cond("Evicted", "True", "Preempted", "Preempted to accommodate"),
                         cond("Admitted", "False", "NoReservation")])
    status = {**running_status(restarts=2), "phase": "Queued", "reason": "Preempted"}
    waiting = plan(kueue_job(status, suspend=True), [], workload=released)
    assert not actions(waiting, kueue_actions.ApplyWorkloadStatus) and not actions(waiting, planner.SetSuspend)
    assert (waiting.status.phase, waiting.status.reason) == ("Queued", "Preempted")
    # Kueue admits it again (it resets Evicted): the job is unsuspended and its pods come back.
    again = plan(kueue_job(status, suspend=True), [], workload=workload(ADMITTED, admission(2)))
    assert [a.suspend for a in actions(again, planner.SetSuspend)] == [False]
    resumed = plan(kueue_job(waiting.status.wire(), suspend=False), [], workload=workload(ADMITTED, admission(2)))
    assert sorted(p["metadata"]["name"] for p in created(resumed, "Pod")) == [
        "train-rdzv", "train-worker-0", "train-worker-1"]
    assert resumed.status.restarts == 2 and "RendezvousLost" not in [e.reason for e in resumed.events]


# --- the end ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase, reason", [("Succeeded", "Succeeded"), ("Failed", "Failed")])
def test_a_finished_job_marks_its_workload_finished(phase, reason):
    status = {"phase": phase, "reason": "X", "message": "done", "completionTime": OLD}
    result = plan(kueue_job(status), [], workload=workload(ADMITTED, admission(2)))
    (finish,) = actions(result, kueue_actions.ApplyWorkloadStatus)
    conds = {c["type"]: c for c in finish.body["status"]["conditions"]}
    assert (conds["Finished"]["status"], conds["Finished"]["reason"], conds["Finished"]["message"]) == (
        "True", reason, "done")
    assert finish.body["status"]["admission"] == admission(2)  # kept: Kueue frees a finished one's quota
    assert kueue_admission(result.status).state == "Finished"
    done = workload(ADMITTED + [cond("Finished", "True", reason)], admission(2))
    assert not actions(plan(kueue_job(status), [], workload=done), kueue_actions.ApplyWorkloadStatus)


def test_the_end_of_a_job_that_never_got_a_workload_touches_nothing():
    status = {"phase": "Failed", "reason": "InvalidSpec", "completionTime": OLD}
    assert not actions(plan(kueue_job(status), []), kueue_actions.ApplyWorkloadStatus)


def test_a_workload_of_an_earlier_job_of_the_same_name_is_not_ours():
    wl = workload(ADMITTED, admission(2))
    theirs = workloads.WorkloadView(**{**wl.__dict__, "owner_uid": "uid-of-an-earlier-job"})
    result = plan(kueue_job(suspend=True), [], workload=theirs)
    assert created(result, "Workload") and not actions(result, planner.SetSuspend)


def test_status_changes_and_events_come_once_per_transition():
    first = plan(kueue_job(suspend=True), [], workload=workload(PENDING))
    again = planner.plan(kueue_job(first.status.wire(), suspend=True),
                         observed([], SERVICE, workload=workload(PENDING)), NOW + timedelta(seconds=5), KUEUE)
    assert [e.reason for e in first.events] == ["Queued"] and again.events == []
    assert kueue_admission(again.status).last_transition_time == kueue_admission(first.status).last_transition_time


@pytest.mark.parametrize("assigned, desired, spares", [
    (4, 3, 1),  # the workers and the spare admitted
    (3, 3, 0),  # partial admission: the spare goes first
    (2, 2, 0),
])
def test_warm_spares_are_admitted_after_the_workers(assigned, desired, spares):
    j = kueue_job(running_status(), minReplicas=1, maxReplicas=3, replicas=3, spares=1)
    result = plan(j, [rdzv()], workload=workload(ADMITTED, admission(assigned), workers=(4, 1)), settings=CLAMPED)
    assert (result.status.desired_replicas, result.status.desired_spares) == (desired, spares)
    assert len(creates(result)) == assigned
