"""Workload slices, decision by decision: a job under Kueue that grows past its admitted slice asks for a new
one and runs what was admitted until Kueue admits it; shrinks in place; drops a slice it no longer needs; and
finishes a slice that an admitted one replaced."""

from __future__ import annotations

import pytest
from factory import NOW, SERVICE, UID, creates, deletes, job, observed, rdzv, running_status, with_kueue, worker

from elasticjob import planner
from elasticjob.kueue import actions as kueue_actions
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue import workloads
from elasticjob.kueue.status import admission as kueue_admission
from elasticjob.kueue.workloads import FlavorView

KUEUE = with_kueue(on=True)
WL = "elasticjob-train-e0019"
FLAVORS = {"f": FlavorView("f")}


def cond(kind, status, reason="", message=""):
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T11:00:00Z", "observedGeneration": 1}


ADMITTED = [cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted")]
PENDING = [cond("QuotaReserved", "False", "Pending", "insufficient unused quota for cpu in flavor f, 1 more needed")]
REPLACED = ADMITTED + [cond("Finished", "True", "WorkloadSliceReplaced")]


def slice_(name=WL, count=2, conditions=ADMITTED, granted=None, replaces=None, created="2026-01-01T11:00:00Z",
           minimum=None, rv="77"):
    status = {"conditions": list(conditions)}
    if any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in conditions):
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "count": granted or count, "flavors": {"cpu": "f"}},
            {"name": "store", "count": 1, "flavors": {"cpu": "f"}}]}
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": rv, "generation": 1,
            "creationTimestamp": created, "ownerReferences": [{"controller": True, "uid": UID}]}
    if replaces:
        meta["annotations"] = {workloads.REPLACES_ANNOTATION: f"ml/{replaces}"}
    workers = {"name": "workers", "count": count, "template": {"spec": {"containers": [{"name": "w"}]}}}
    if minimum:
        workers["minCount"] = minimum
    return workloads.workload_view({"metadata": meta, "spec": {"queueName": "lq", "podSets": [
        workers, {"name": "store", "count": 1}]}, "status": status})


def plan(replicas, pods, *workloads, settings=KUEUE):
    j = job(running_status(), labels={kueue_names.QUEUE_LABEL: "lq"}, minReplicas=1, maxReplicas=4, replicas=replicas,
            runPolicy={"suspend": False})
    seen = observed(pods, SERVICE, workloads=workloads, flavors=FLAVORS)
    return planner.plan(j, seen, NOW, settings)


def actions(result, kind):
    return [a for a in result.actions if isinstance(a, kind)]


def workloads_made(result):
    return [a.manifest for a in actions(result, planner.CreateObject) if a.manifest["kind"] == "Workload"]


def workers(n):
    return [rdzv(), *(worker(i) for i in range(n))]


def test_growing_past_the_admitted_slice_asks_for_a_new_one_and_runs_what_was_admitted():
    result = plan(4, workers(2), slice_())
    [made] = workloads_made(result)
    assert made["metadata"]["name"] == f"{WL}-s1"
    assert made["metadata"]["annotations"] == {workloads.ELASTIC_ANNOTATION: "true",
                                               workloads.REPLACES_ANNOTATION: f"ml/{WL}",
                                               workloads.SLICE_NAME_ANNOTATION: WL}
    [pod_set] = [p for p in made["spec"]["podSets"] if p["name"] == "workers"]
    assert pod_set["count"] == 4 and "minCount" not in pod_set  # Kueue refuses partial admission of a slice
    assert creates(result) == [] and deletes(result) == []  # the running world is left alone
    admission = kueue_admission(result.status)
    assert (admission.workers, admission.requested) == (2, 4)
    assert f"4 asked of Kueue in Workload {WL}-s1" in result.status.message


def test_a_slice_kueue_has_not_admitted_is_asked_once_and_its_wait_shown():
    result = plan(4, workers(2), slice_(), slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z"))
    assert not workloads_made(result) and not actions(result, kueue_actions.PatchWorkload)
    assert "not admitted: insufficient unused quota for cpu in flavor f" in kueue_admission(result.status).message
    assert result.status.phase == "Running" and "2/2 workers ready" in result.status.message


def test_a_pending_slice_follows_the_spec():
    result = plan(3, workers(2), slice_(), slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z"))
    [patch] = actions(result, kueue_actions.PatchWorkload)
    assert patch.name == f"{WL}-s1" and [p["count"] for p in patch.pod_sets] == [3, 1]


@pytest.mark.parametrize("replicas", [2, 1])
def test_a_pending_slice_no_longer_needed_is_deleted_only_if_unchanged(replicas):
    pending = slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z", rv="90")
    result = plan(replicas, workers(2), slice_(), pending)
    [delete] = actions(result, planner.DeleteObject)
    assert (delete.name, delete.uid, delete.resource_version) == (pending.name, pending.uid, "90")
    assert kueue_admission(result.status).requested is None


def test_once_kueue_admits_the_new_slice_the_job_grows_and_the_old_slice_is_finished():
    old = slice_(conditions=ADMITTED)
    new = slice_(f"{WL}-s1", 4, ADMITTED, replaces=WL, created="2026-01-01T11:01:00Z")
    result = plan(4, workers(2), old, new)
    assert creates(result) == ["train-worker-2", "train-worker-3"]
    [finish] = actions(result, kueue_actions.ApplyWorkloadStatus)
    assert finish.name == WL
    finished = next(c for c in finish.body["status"]["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", workloads.SLICE_REPLACED)
    assert (kueue_admission(result.status).workload, kueue_admission(result.status).workers) == (f"{WL}-s1", 4)


def test_a_slice_kueue_already_marked_replaced_is_left_alone():
    old = slice_(conditions=REPLACED)
    new = slice_(f"{WL}-s1", 4, ADMITTED, replaces=WL, created="2026-01-01T11:01:00Z")
    result = plan(4, workers(4), old, new)
    assert not actions(result, kueue_actions.ApplyWorkloadStatus) and not workloads_made(result)


def test_shrinking_gives_quota_back_in_place():
    result = plan(2, workers(4), slice_(count=4))
    [patch] = actions(result, kueue_actions.PatchWorkload)
    assert patch.name == WL and patch.resource_version == "77"
    assert [p["count"] for p in patch.pod_sets] == [2, 1]
    assert patch.pod_sets[0]["template"] == {"spec": {"containers": [{"name": "w"}]}}  # the rest as stored
    assert patch.event.reason == "ScaledDown"
    assert deletes(result) == [("train-worker-2", None), ("train-worker-3", None)]


def test_a_slice_shrunk_in_place_counts_its_spec_not_its_admission():
    result = plan(3, workers(2), slice_(count=2, granted=4))
    [made] = workloads_made(result)  # Kueue holds quota for 2 now: a third worker needs a slice
    assert made["spec"]["podSets"][0]["count"] == 3 and creates(result) == []


def test_a_slice_name_is_never_reused():
    old = slice_(conditions=REPLACED)
    s1 = slice_(f"{WL}-s1", 3, ADMITTED, replaces=WL, created="2026-01-01T11:01:00Z")
    result = plan(4, workers(3), old, s1)
    [made] = workloads_made(result)
    assert made["metadata"]["name"] == f"{WL}-s2"
    assert made["metadata"]["annotations"][workloads.REPLACES_ANNOTATION] == f"ml/{WL}-s1"


def test_without_slices_the_admitted_count_is_a_cap():
    result = plan(4, workers(2), slice_(), settings=with_kueue(on=True, slices=False))
    assert not workloads_made(result) and creates(result) == []
    assert "replicas 4 exceeds the 2 workers Kueue admitted" in result.status.message


def test_an_evicted_job_drops_its_pending_slice():
    evicted = ADMITTED + [cond("Evicted", "True", "Preempted", "preempted")]
    pending = slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z")
    j = job(running_status(), labels={kueue_names.QUEUE_LABEL: "lq"}, minReplicas=1, maxReplicas=4, replicas=4,
            runPolicy={"suspend": True})
    seen = (slice_(conditions=evicted), pending)
    result = planner.plan(j, observed([rdzv()], SERVICE, workloads=seen, flavors=FLAVORS), NOW, KUEUE)
    assert [a.name for a in actions(result, planner.DeleteObject)] == [pending.name]


def test_a_preempted_slice_is_requeued_as_a_new_workload_that_kueue_may_admit_in_part():
    # Grown through slice s1 (the first Workload Finished, replaced), then preempted: every pod stopped and s1's
    # quota released. A slice is admitted whole, so s1 goes and a new Workload asks again down to minReplicas, under
    # a name not taken (the first's still is). Deleting s1 as a pending slice, and asking for the first's name
    # again, left the job waiting for good (seen on real nodes with Kueue).
    released = [cond("QuotaReserved", "False", "Pending"), cond("Evicted", "True", "Preempted", "preempted")]
    current = slice_(f"{WL}-s1", 4, released, replaces=WL, created="2026-01-01T11:01:00Z")
    j = job(running_status(), labels={kueue_names.QUEUE_LABEL: "lq"}, minReplicas=1, maxReplicas=4, replicas=4,
            runPolicy={"suspend": True})
    seen = (slice_(conditions=REPLACED), current)
    result = planner.plan(j, observed([], SERVICE, workloads=seen, flavors=FLAVORS), NOW, KUEUE)
    [deleted] = actions(result, planner.DeleteObject)
    assert deleted.name == current.name and deleted.event.reason == "Requeued"
    assert workloads_made(result) == [] and result.status.phase.value == "Queued"
    # s1 gone: a new first Workload, partial admission down to minReplicas.
    result = planner.plan(j, observed([], SERVICE, workloads=(slice_(conditions=REPLACED),), flavors=FLAVORS), NOW,
                          KUEUE)
    [made] = workloads_made(result)
    assert made["metadata"]["name"] == f"{WL}-s1" and "annotations" not in made["metadata"]
    [pod_set] = [p for p in made["spec"]["podSets"] if p["name"] == "workers"]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 1)
    assert kueue_admission(result.status).workload == f"{WL}-s1"


@pytest.mark.parametrize("seen, want", [
    ([], None),
    ([slice_()], WL),
    ([slice_(), slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z")], WL),
    ([slice_(), slice_(f"{WL}-s1", 4, ADMITTED, replaces=WL, created="2026-01-01T11:01:00Z")], f"{WL}-s1"),
    ([slice_(conditions=REPLACED), slice_(f"{WL}-s1", 4, ADMITTED, replaces=WL, created="2026-01-01T11:01:00Z")],
     f"{WL}-s1"),
    ([slice_(conditions=PENDING)], WL),  # the first Workload, not admitted yet
    ([slice_(conditions=ADMITTED + [cond("Evicted", "True", "Preempted")]),  # its pods must stop first
      slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z")], WL),
    ([slice_(conditions=PENDING), slice_(f"{WL}-s1", 4, PENDING, replaces=WL, created="2026-01-01T11:01:00Z")], WL),
])
def test_the_slice_that_counts(seen, want):
    found = workloads.current_slice(seen)
    assert (found.name if found else None) == want
