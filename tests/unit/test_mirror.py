"""The mirror of the cluster: watch events, relists that remove what was deleted unseen, ownership by uid."""

from __future__ import annotations

from elasticjob.controller.mirror import Mirror


def pod(name: str, job: str = "train", ns: str = "ml", uid: str | None = None, owner: str = "job-uid-1",
        phase: str = "Running", rv: str = "1") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "resourceVersion": rv,
                         "labels": {"elasticjob.dev/job-name": job, "elasticjob.dev/role": "worker",
                                    "elasticjob.dev/replica-index": name[-1]},
                         "ownerReferences": [{"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob", "name": job,
                                              "uid": owner, "controller": True}]},
            "status": {"phase": phase}}


def jobbody(name: str = "train", uid: str = "job-uid-1", rv: str = "5", ns: str = "ml", created: str = "") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv,
                         "creationTimestamp": created}, "spec": {}}


def test_a_relist_removes_pods_deleted_while_no_watch_ran_and_wakes_their_jobs():
    mirror = Mirror()
    mirror.pods.replace(None, [pod("train-worker-0"), pod("train-worker-1"), pod("other-worker-0", job="other")])
    # An API server restart: the DELETED event of worker-1 was never seen.
    touched = mirror.pods.replace(None, [pod("train-worker-0"), pod("other-worker-0", job="other")])
    assert touched == {("ml", "train")}
    assert [p.name for p in mirror.pods.of(("ml", "train"))] == ["train-worker-0"]


def test_a_relist_of_one_namespace_leaves_the_others_alone():
    mirror = Mirror()
    mirror.pods.replace("ml", [pod("train-worker-0")])
    mirror.pods.replace("cv", [pod("seg-worker-0", job="seg", ns="cv")])
    assert mirror.pods.replace("ml", []) == {("ml", "train")}
    assert len(mirror.pods.of(("cv", "seg"))) == 1


def test_updates_that_change_nothing_the_planner_reads_wake_no_one():
    mirror = Mirror()
    assert mirror.pods.apply("ADDED", pod("train-worker-0")) == {("ml", "train")}
    assert mirror.pods.apply("MODIFIED", pod("train-worker-0", rv="2")) == set()
    assert mirror.pods.apply("MODIFIED", pod("train-worker-0", phase="Failed", rv="3")) == {("ml", "train")}
    assert mirror.pods.apply("DELETED", pod("train-worker-0")) == {("ml", "train")}
    assert mirror.pods.of(("ml", "train")) == []


def test_objects_without_the_job_label_are_ignored():
    mirror = Mirror()
    stray = pod("x")
    del stray["metadata"]["labels"]["elasticjob.dev/job-name"]
    assert mirror.pods.apply("ADDED", stray) == set() and len(mirror.pods) == 0


def test_a_recreated_job_sees_only_what_it_made():
    """delete + apply under the same name: the old job's completed workers linger until garbage collected."""
    mirror = Mirror()
    mirror.pods.apply("ADDED", pod("train-worker-0", uid="old-0", owner="old-job", phase="Succeeded"))
    mirror.pods.apply("ADDED", pod("train-worker-1", uid="new-1", owner="new-job"))
    assert [p.uid for p in mirror.owned_pods(("ml", "train"), "new-job")] == ["new-1"]
    assert mirror.owned_service(("ml", "train"), "new-job", "train-rdzv") is None


def test_jobs_change_only_with_their_resource_version_and_leave_on_relist():
    mirror = Mirror()
    assert mirror.jobs.apply("ADDED", jobbody()) == {("ml", "train")}
    assert mirror.jobs.apply("MODIFIED", jobbody()) == set()
    assert mirror.jobs.apply("MODIFIED", jobbody(rv="6")) == {("ml", "train")}
    assert mirror.has_job(("ml", "train"))
    assert mirror.jobs.replace(None, []) == {("ml", "train")}
    assert mirror.job(("ml", "train")) is None and not mirror.has_job(("ml", "train"))


def test_of_two_jobs_under_one_name_the_newest_is_the_job():
    mirror = Mirror()
    mirror.jobs.apply("ADDED", jobbody(uid="old", created="2026-01-01T10:00:00Z"))
    mirror.jobs.apply("ADDED", jobbody(uid="new", created="2026-01-01T11:00:00Z"))
    assert mirror.job(("ml", "train"))["metadata"]["uid"] == "new"


def test_a_created_pod_is_known_at_once_but_never_over_what_the_watch_delivered():
    mirror = Mirror()
    created = {**pod("train-worker-0", phase="Pending"), "kind": "Pod"}
    assert mirror.add_created(created)
    assert [p.phase for p in mirror.owned_pods(("ml", "train"), "job-uid-1")] == ["Pending"]
    # The watch got there first with something newer: the create's reply (older) must not replace it.
    mirror.pods.apply("MODIFIED", pod("train-worker-1", phase="Running"))
    assert not mirror.add_created({**pod("train-worker-1", phase="Pending"), "kind": "Pod"})
    assert {p.name: p.phase for p in mirror.pods.of(("ml", "train"))} == \
        {"train-worker-0": "Pending", "train-worker-1": "Running"}
    # Later watch events replace the created view as usual.
    mirror.pods.apply("MODIFIED", pod("train-worker-0", phase="Running"))
    assert {p.phase for p in mirror.pods.of(("ml", "train"))} == {"Running"}


def test_only_pods_and_services_are_mirrored_from_creates():
    mirror = Mirror()
    assert not mirror.add_created({"kind": "Secret", "metadata": {"name": "s", "namespace": "ml", "uid": "u",
                                                                 "labels": {"elasticjob.dev/job-name": "train"}}})


def test_jobs_are_kept_without_their_managed_fields():
    mirror = Mirror()
    body = jobbody()
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    mirror.jobs.apply("ADDED", body)
    kept = mirror.job(("ml", "train"))
    assert "managedFields" not in kept["metadata"] and kept["metadata"]["uid"] == "job-uid-1"
    assert "managedFields" in body["metadata"]  # the watch's own object is not changed


def test_a_create_reply_that_arrives_after_the_pods_deletion_does_not_revive_it():
    mirror = Mirror()
    mirror.pods.apply("ADDED", pod("train-worker-0"))
    mirror.pods.apply("DELETED", pod("train-worker-0"))
    assert not mirror.add_created({**pod("train-worker-0", phase="Pending"), "kind": "Pod"})
    assert mirror.pods.of(("ml", "train")) == []


def test_leftovers_are_what_another_job_of_the_name_controls_and_is_not_already_deleting():
    mirror = Mirror()
    going = pod("train-worker-2", owner="job-uid-0")
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    unowned = pod("train-worker-3")
    unowned["metadata"]["ownerReferences"] = []
    mirror.pods.replace(None, [pod("train-worker-0"), pod("train-worker-1", owner="job-uid-0"), going, unowned])
    assert [(x.kind, x.name, x.owner_uid) for x in mirror.leftovers(("ml", "train"), "job-uid-1")] == [
        ("Pod", "train-worker-1", "job-uid-0")]
