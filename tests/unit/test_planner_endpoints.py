"""The rendezvous Service's endpoints are the operator's alone, and only the Service it made counts.

The Service has no selector: any EndpointSlice labelled kubernetes.io/service-name with its name joins it, and so
does an Endpoints object of its name (the endpointslice-mirroring controller copies it into a slice). Either would
receive the agents' connections and the operator's token.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from factory import NOW, SERVICE, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.controller.mirror import Mirror
from elasticjob.models import ElasticJobStatus
from elasticjob.observe import ServiceView, SliceView, service_view, slice_view
from elasticjob.planner import ownership

TOKEN = "job-token"
OURS = SliceView(name="train-rdzv", uid="uid-slice", service="train-rdzv", addresses=("10.244.1.7",))
FOREIGN = SliceView(name="evil", uid="uid-evil", service="train-rdzv", addresses=("10.9.9.9",))
MIRRORED = SliceView(name="train-rdzv-abcde", uid="uid-m", service="train-rdzv", addresses=("10.9.9.9",),
                     mirrored_from=("train-rdzv", "uid-ep"))
# A slice claiming to be mirrored from the Endpoints of another Service: that one is not the job's to delete.
CLAIMING = SliceView(name="claims", uid="uid-c", service="train-rdzv", mirrored_from=("db", "uid-db-ep"))


def deleted(result: planner.Plan) -> list[tuple[str, str, str]]:
    return sorted((a.kind, a.name, a.uid) for a in result.actions if isinstance(a, planner.DeleteObject))


def signed(**extra) -> dict:
    return running_status(ownedPods=[], **extra)


@pytest.mark.parametrize("slices, expected", [
    ((OURS,), []),
    ((OURS, FOREIGN), [("EndpointSlice", "evil", "uid-evil")]),
    ((FOREIGN,), [("EndpointSlice", "evil", "uid-evil")]),  # made before the operator's own
    ((OURS, MIRRORED), [("EndpointSlice", "train-rdzv-abcde", "uid-m"), ("Endpoints", "train-rdzv", "uid-ep")]),
    ((CLAIMING,), [("EndpointSlice", "claims", "uid-c")]),
])
def test_endpoint_slices_the_operator_did_not_make_are_deleted(slices, expected):
    result = planner.plan(job(signed()), observed([rdzv(ip="10.244.1.7"), worker(0), worker(1)],
                                                  endpoint_slices=slices), NOW)
    assert deleted(result) == expected
    events = [a.event for a in result.actions if isinstance(a, planner.DeleteObject) and a.event]
    assert all(e.reason == "ForeignEndpoints" and "10.9.9.9" in e.message for e in events if "evil" in e.message)


def test_a_job_that_keeps_its_selector_leaves_kubernetes_own_slices_alone():
    result = planner.plan(job(running_status()), observed([rdzv(ip="10.244.1.7"), worker(0)],
                                                          endpoint_slices=(FOREIGN,)), NOW)
    assert deleted(result) == []


def slice_body(name: str, service: str, **meta) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "labels": {"kubernetes.io/service-name": service, **meta.pop("labels", {})}, **meta},
            "endpoints": [{"addresses": ["10.9.9.9"]}]}


def test_the_mirror_keeps_the_slices_of_rendezvous_services_by_job_without_any_label_of_ours():
    mirror = Mirror()
    assert mirror.slices.apply("ADDED", slice_body("evil", "train-rdzv")) == {("ml", "train")}
    assert mirror.slices.apply("ADDED", slice_body("web-x1", "web")) == set()  # another Service's: not kept
    mirror.slices.apply("ADDED", slice_body("own", "train-rdzv-k2j4x"))  # a renamed Service's
    assert [s.name for s in mirror.endpoint_slices("ml", "train-rdzv")] == ["evil"]
    assert [s.name for s in mirror.endpoint_slices("ml", "train-rdzv-k2j4x")] == ["own"]
    mirrored = slice_body("m", "train-rdzv", labels={
        "endpointslice.kubernetes.io/managed-by": "endpointslicemirroring-controller.k8s.io"},
        ownerReferences=[{"apiVersion": "v1", "kind": "Endpoints", "name": "train-rdzv", "uid": "uid-ep",
                          "controller": True}])
    assert slice_view(mirrored).mirrored_from == ("train-rdzv", "uid-ep")
    assert slice_view(slice_body("evil", "train-rdzv")).mirrored_from is None


def status(service_uid: str | None = None, records: list | None = None) -> ElasticJobStatus:
    return ElasticJobStatus.model_validate({"ownedPods": records or [], "rendezvous": {"serviceUid": service_uid}})


MARKED = replace(SERVICE, mark=ownership.mark(TOKEN, "Service", SERVICE.name, 0))


@pytest.mark.parametrize("service, recorded, admitted", [
    (MARKED, None, True),  # just made: its mark vouches until its uid is recorded
    (MARKED, SERVICE.uid, True),
    # Deleted and made again by someone, its annotations copied: the mark verifies, the uid is another.
    (replace(MARKED, uid="uid-copy"), SERVICE.uid, False),
    (replace(MARKED, selector=True), SERVICE.uid, False),  # a selector routes to any pod labelled as the store
    (replace(MARKED, selector=True), None, False),
    (SERVICE, None, False),
])
def test_only_the_service_the_operator_made_counts(service: ServiceView, recorded, admitted):
    assert ownership.service_admitted(service, status(recorded), TOKEN) == (service if admitted else None)


def test_a_service_the_operator_did_not_make_is_replaced_not_adopted():
    copy = replace(MARKED, uid="uid-copy", selector=True)
    result = planner.plan(job(signed(rendezvous={"endpoint": "10.96.0.42:29400", "serviceUid": SERVICE.uid})),
                          observed([rdzv(ip="10.244.1.7"), worker(0)], service=None, rejected_service=copy), NOW)
    assert [(a.name, a.uid) for a in result.actions if isinstance(a, planner.DeleteService)] == [
        ("train-rdzv", "uid-copy")]
    assert not [a for a in result.actions if isinstance(a, planner.CreateObject) and a.manifest["kind"] == "Service"]
    assert [e.reason for e in result.events] == ["ServiceReplaced"]
    # Once it is gone the operator makes its own, whose uid is recorded when seen (the old record cleared).
    gone = planner.plan(job(result.status.model_dump(by_alias=True, mode="json")),
                        observed([rdzv(ip="10.244.1.7"), worker(0)], service=None), NOW, token=TOKEN)
    made = [a.manifest for a in gone.actions if isinstance(a, planner.CreateObject) and a.manifest["kind"] == "Service"]
    assert len(made) == 1 and "selector" not in made[0]["spec"]
    assert gone.status.rendezvous.service_uid is None


def test_a_service_with_a_selector_is_seen_as_one():
    assert service_view({"metadata": {"name": "s"}, "spec": {"selector": {"a": "b"}}}).selector
    assert not service_view({"metadata": {"name": "s"}, "spec": {}}).selector
