"""Only the pods the operator made count: signed pods, records per name, copies of gone pods refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.factory import NOW, SERVICE, UID, creates, failed, job, observed, rdzv, worker

from elasticjob import planner
from elasticjob.models import ElasticJobStatus
from elasticjob.observe import PodView, ServiceView, pod_view
from elasticjob.planner import ownership

TOKEN = "job-token"


def signed(view: PodView, serial: int = 1, token: str = TOKEN) -> PodView:
    return replace(view, serial=serial, mark=ownership.mark(token, "Pod", view.name, serial))


def status(records: list[tuple] | None = None, started: bool = True) -> ElasticJobStatus:
    key = ownership.key_id(TOKEN)
    owned = None if records is None else [{"name": r[0], "serial": r[1], "uid": r[2], "key": (r[3:] or (key,))[0]}
                                          for r in records]
    started_at = "2026-01-01T11:00:00Z" if started else None
    return ElasticJobStatus.model_validate({"ownedPods": owned, "startTime": started_at})


@pytest.mark.parametrize("pod, records, admitted", [
    (signed(worker(0)), [], True),  # made, not yet recorded
    (signed(worker(0)), [("train-worker-0", 1, "uid-w0")], True),
    (worker(0), [], False),  # a controller ownerReference and the job's labels, no mark
    (signed(worker(0), token="another-jobs-token"), [], False),
    (replace(signed(worker(0)), mark="0" * 64), [], False),
    (replace(signed(worker(0)), serial=2), [], False),  # the mark of serial 1 on serial 2
    # A copy of a real pod's annotations, made after that pod was gone: its name's record holds the real uid.
    (signed(worker(0, uid="copy")), [("train-worker-0", 1, "uid-w0")], False),
    # A copy of an earlier making of the name.
    (signed(worker(0, uid="copy"), serial=1), [("train-worker-0", 2, "")], False),
    (signed(worker(0), serial=3), [("train-worker-0", 2, "uid-old")], True),  # the newest making
    # The operator's key changed (a restart without a key file): its records vouch for what they name.
    (signed(worker(0), token="old-key"), [("train-worker-0", 1, "uid-w0", "old")], True),
    (signed(worker(0), token="old-key"), [("train-worker-0", 1, "", "old")], True),
    (signed(worker(0), token="old-key"), [("train-worker-0", 1, "")], False),  # no key change: a forgery
    (signed(worker(0, uid="copy"), token="old-key"), [("train-worker-0", 1, "uid-w0", "old")], False),
])
def test_admit(pod, records, admitted):
    assert ownership.admit([pod], status(records), TOKEN) == ([pod] if admitted else [])


def test_a_job_started_before_pods_were_signed_trusts_its_owner_references():
    assert ownership.admit([worker(0)], status(None), TOKEN) == [worker(0)]
    assert ownership.admit([worker(0)], status(None, started=False), TOKEN) == []


def test_a_new_job_signs_its_pods_and_records_them_once_seen():
    first = planner.plan(job({"phase": "Pending"}), observed([]), NOW, token=TOKEN)
    store = next(a.manifest for a in first.actions if isinstance(a, planner.CreateObject)
                 and a.manifest["kind"] == "Pod")
    annotations = store["metadata"]["annotations"]
    assert annotations["elasticjob.dev/serial"] == "1"
    assert annotations["elasticjob.dev/mark"] == ownership.mark(TOKEN, "Pod", "train-rdzv", 1)
    body = {**store, "metadata": {**store["metadata"], "uid": "uid-r"}}
    seen = pod_view(body)
    assert ownership.admit([seen], first.status, TOKEN) == [seen]
    later = planner.plan(job(first.status.model_dump(by_alias=True, mode="json")), observed([seen]), NOW,
                         token=TOKEN)
    assert [(r.name, r.serial, r.uid) for r in later.status.owned_pods] == [
        ("train-rdzv", 1, "uid-r"), ("train-worker-0", 1, ""), ("train-worker-1", 1, "")]


def test_a_replacement_is_a_new_making_and_a_repeated_create_the_same():
    records = [("train-rdzv", 1, "uid-r"), ("train-worker-0", 1, "uid-w0"), ("train-worker-1", 1, "")]
    current = status(records).model_dump(by_alias=True, mode="json")
    pods = [signed(rdzv()), signed(worker(0, phase="Failed"))]
    result = planner.plan(job({**current, "phase": "Running"}), observed(pods), NOW, token=TOKEN)
    assert creates(result) == ["train-worker-1"]
    made = next(a.manifest for a in result.actions if isinstance(a, planner.CreateObject))
    assert made["metadata"]["annotations"]["elasticjob.dev/serial"] == "1"  # not seen yet: asked again as is
    gone = planner.plan(job({**result.status.model_dump(by_alias=True, mode="json")}),
                        observed([signed(rdzv())]), NOW, token=TOKEN)
    serials = {a.manifest["metadata"]["name"]: a.manifest["metadata"]["annotations"]["elasticjob.dev/serial"]
               for a in gone.actions if isinstance(a, planner.CreateObject)}
    assert serials == {"train-worker-0": "2", "train-worker-1": "1"}


def test_the_service_counts_only_with_its_mark():
    marked = replace(SERVICE, mark=ownership.mark(TOKEN, "Service", SERVICE.name, 0))
    assert ownership.service_admitted(marked, status([]), TOKEN) == marked
    assert ownership.service_admitted(SERVICE, status([]), TOKEN) is None
    assert ownership.service_admitted(SERVICE, status(None), TOKEN) == SERVICE
    # Seen once, its uid is recorded: it counts whatever key signed it (a new random key at each start).
    seen = planner.plan(job(status([]).model_dump(by_alias=True, mode="json")), observed([], service=marked), NOW,
                        token=TOKEN)
    assert seen.status.rendezvous.service_uid == SERVICE.uid
    # Every record since made under the new key: the Service still counts by its uid, and only by it.
    renewed = status([("train-rdzv", 2, "uid-r2", ownership.key_id("a-new-key"))])
    assert ownership.service_admitted(marked, renewed, "a-new-key") is None
    renewed.rendezvous.service_uid = seen.status.rendezvous.service_uid
    assert ownership.service_admitted(marked, renewed, "a-new-key") == marked


def service_of(result: planner.Plan) -> dict:
    return next(a.manifest for a in result.actions
                if isinstance(a, planner.CreateObject) and a.manifest["kind"] == "Service")


def signed_service(serial: int, uid: str) -> ServiceView:
    return replace(SERVICE, uid=uid, serial=serial, mark=ownership.mark(TOKEN, "Service", SERVICE.name, serial))


def test_each_making_of_the_service_has_a_serial_and_a_copy_of_an_earlier_one_is_refused():
    first = planner.plan(job(status([]).model_dump(by_alias=True, mode="json")), observed([], service=None), NOW,
                         token=TOKEN)
    annotations = service_of(first)["metadata"]["annotations"]
    assert annotations["elasticjob.dev/serial"] == "1" and first.status.rendezvous.service_serial == 1
    assert annotations["elasticjob.dev/mark"] == ownership.mark(TOKEN, "Service", SERVICE.name, 1)
    # Not seen yet: asked for again as is (a 409 means it is made).
    again = planner.plan(job(first.status.model_dump(by_alias=True, mode="json")), observed([], service=None),
                         NOW, token=TOKEN)
    assert service_of(again)["metadata"]["annotations"]["elasticjob.dev/serial"] == "1"
    seen = planner.plan(job(first.status.model_dump(by_alias=True, mode="json")),
                        observed([], service=signed_service(1, "uid-1")), NOW, token=TOKEN)
    assert seen.status.rendezvous.service_uid == "uid-1"
    # Deleted: the next making is the second, whether the first one's uid was written or not.
    for known in (seen.status, first.status):
        gone = planner.plan(job(known.model_dump(by_alias=True, mode="json")), observed([], service=None), NOW,
                            token=TOKEN)
        assert service_of(gone)["metadata"]["annotations"]["elasticjob.dev/serial"] == ("2" if known is seen.status
                                                                                         else "1")
    renewed = planner.plan(job(seen.status.model_dump(by_alias=True, mode="json")), observed([], service=None),
                           NOW, token=TOKEN).status
    assert renewed.rendezvous.service_serial == 2 and renewed.rendezvous.service_uid is None
    # A copy of the first making's annotations on a Service made after it was gone, before the second is made.
    assert ownership.service_admitted(signed_service(1, "copy"), renewed, TOKEN) is None
    assert ownership.service_admitted(signed_service(2, "uid-2"), renewed, TOKEN) is not None


def test_a_service_made_before_serials_counts_by_its_uid_or_its_mark():
    old = replace(SERVICE, mark=ownership.mark(TOKEN, "Service", SERVICE.name, 0))
    assert ownership.service_admitted(old, status([]), TOKEN) == old
    recorded = status([])
    recorded.rendezvous.service_uid = SERVICE.uid
    assert ownership.service_admitted(SERVICE, recorded, TOKEN) == SERVICE


def test_an_owner_reference_of_another_api_names_no_job():
    body = {"metadata": {"name": "train-worker-0", "uid": "u", "ownerReferences": [
        {"apiVersion": "evil.example/v1", "kind": "ElasticJob", "name": "train", "uid": UID, "controller": True}]}}
    assert pod_view(body).owner_uid is None
    body["metadata"]["ownerReferences"][0]["apiVersion"] = "elasticjob.dev/v1alpha1"
    assert pod_view(body).owner_uid == UID


def test_failed_forgeries_never_reach_the_count():
    forged = [failed(0, uid="evil"), worker(1, phase="Succeeded", uid="evil-2")]
    assert ownership.admit(forged, status([]), TOKEN) == []


def test_names_an_earlier_job_still_holds_are_made_under_their_alternates():
    taken = frozenset({"train-worker-0", "train-rdzv"})
    first = planner.plan(job({"phase": "Pending"}), observed([], taken=taken), NOW, token=TOKEN)
    suffix = UID[:5]
    made = [f"train-rdzv-{suffix}", f"train-worker-0-{suffix}", "train-worker-1"]
    assert creates(first) == made and first.status.rendezvous.pod == f"train-rdzv-{suffix}"
    # The earlier job's pods are gone before the creates were seen: the same names are asked for again (409),
    # never a second pod.
    again = planner.plan(job(first.status.model_dump(by_alias=True, mode="json")), observed([]), NOW, token=TOKEN)
    assert creates(again) == made
    # Nothing taken: the usual names.
    fresh = planner.plan(job({"phase": "Pending"}), observed([]), NOW, token=TOKEN)
    assert creates(fresh) == ["train-rdzv", "train-worker-0", "train-worker-1"]
