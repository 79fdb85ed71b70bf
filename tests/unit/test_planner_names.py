"""A name another object holds is taken under a suffix, recorded, and said in an Event; the job goes on.

Before: a pod or Service without the job's label under the name the operator asks for (or under the alternate
derived from the job's uid) answered every create with 409, which counted as done: the job waited in silence.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from factory import NOW, SERVICE, UID, job, observed, rdzv, running_status, worker

from elasticjob import naming, planner
from elasticjob.planner import NameTaken

TOKEN = "job-token"


def made(result: planner.Plan, kind: str) -> list[str]:
    return sorted(a.manifest["metadata"]["name"] for a in result.actions
                  if isinstance(a, planner.CreateObject) and a.manifest["kind"] == kind)


def again(result: planner.Plan) -> dict:
    return result.status.model_dump(by_alias=True, mode="json")


def test_a_taken_store_pod_name_is_made_under_a_suffix_recorded_before_it_is_made():
    first = planner.plan(job({"phase": "Pending"}), observed([]), NOW, token=TOKEN)
    assert made(first, "Pod") == ["train-rdzv", "train-worker-0", "train-worker-1"]
    squatted = (NameTaken("Pod", "train-rdzv", "uid-squatter", "x7k2q"),)
    renamed = planner.plan(job(again(first)), observed([], squatted=squatted), NOW, token=TOKEN)
    assert renamed.status.renamed == {"Pod/train-rdzv": "train-rdzv-x7k2q"}
    assert made(renamed, "Pod") == ["train-rdzv-x7k2q", "train-worker-0", "train-worker-1"]
    assert renamed.status.rendezvous.pod == "train-rdzv-x7k2q"
    assert [r.name for r in renamed.status.owned_pods] == ["train-worker-0", "train-worker-1", "train-rdzv-x7k2q"]
    assert [(e.type, e.reason) for e in renamed.events] == [("Warning", "NameTaken")]
    assert "train-rdzv" in renamed.events[0].message and "uid-squatter" in renamed.events[0].message
    # The next reconcile (and a restarted operator, from the status) asks for the same name, and says nothing.
    later = planner.plan(job(again(renamed)), observed([], squatted=squatted), NOW, token=TOKEN)
    assert made(later, "Pod") == made(renamed, "Pod") and later.events == []
    assert planner.plan(job(again(renamed)), observed([]), NOW, token=TOKEN).status.renamed == renamed.status.renamed


def test_a_taken_service_name_renames_the_service_and_its_endpoints():
    squatted = (NameTaken("Service", "train-rdzv", "uid-squatter", "p4m9z"),)
    first = planner.plan(job({"phase": "Pending", "ownedPods": []}), observed([], service=None, squatted=squatted),
                         NOW, token=TOKEN)
    assert made(first, "Service") == ["train-rdzv-p4m9z"]
    assert made(first, "Pod")[0] == "train-rdzv"  # the pod's name is not the Service's: not taken
    service = replace(SERVICE, name="train-rdzv-p4m9z")
    seen = planner.plan(job({**again(first), **running_status(ownedPods=[])}),
                        observed([rdzv(ip="10.244.1.7"), worker(0)], service=service), NOW, token=TOKEN)
    slices = [a.manifest for a in seen.actions if isinstance(a, planner.ApplyObject)]
    assert [(s["metadata"]["name"], s["metadata"]["labels"]["kubernetes.io/service-name"]) for s in slices] == [
        ("train-rdzv-p4m9z", "train-rdzv-p4m9z")]


def test_a_taken_alternate_name_is_renamed_too():
    """The alternate of a name an earlier job still holds is derived from the job's uid, which anyone can read."""
    alternate = naming.alternate_name("train-rdzv", UID)
    first = planner.plan(job({"phase": "Pending"}), observed([], taken=frozenset({"train-rdzv"})), NOW, token=TOKEN)
    assert alternate in made(first, "Pod")
    squatted = (NameTaken("Pod", alternate, "uid-squatter", "b2c4d"),)
    renamed = planner.plan(job(again(first)), observed([], taken=frozenset({"train-rdzv"}), squatted=squatted),
                           NOW, token=TOKEN)
    assert f"{alternate}-b2c4d" in made(renamed, "Pod") and alternate not in made(renamed, "Pod")


def test_a_new_name_taken_in_turn_is_made_from_the_usual_one_again():
    first = planner.plan(job({"phase": "Pending"}), observed([], squatted=(
        NameTaken("Pod", "train-worker-0", "u1", "aaaaa"),)), NOW, token=TOKEN)
    second = planner.plan(job(again(first)), observed([], squatted=(
        NameTaken("Pod", "train-worker-0", "u1", "aaaaa"), NameTaken("Pod", "train-worker-0-aaaaa", "u2", "bbbbb"))),
        NOW, token=TOKEN)
    assert second.status.renamed == {"Pod/train-worker-0": "train-worker-0-bbbbb"}
    assert "train-worker-0-bbbbb" in made(second, "Pod")


@pytest.mark.parametrize("job_name", ["train", "j" * 52, "j" * 58])
def test_a_renamed_service_fits_a_dns_label_and_still_names_its_job(job_name):
    name = naming.with_suffix(naming.rendezvous_name(job_name), "x7k2q", job_name)
    assert len(name) <= 63 and name.endswith("-rdzv-x7k2q")
    assert job_name.startswith(naming.job_of_rendezvous_service(name))
    assert naming.job_of_rendezvous_service(naming.rendezvous_name(job_name)) == job_name
    assert naming.job_of_rendezvous_service("web") is None
