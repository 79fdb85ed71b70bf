"""The rendezvous Service routes to the store pod the operator made, written by the operator, only when changed."""

from __future__ import annotations

from factory import NOW, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.controller.apply import remember_applied, unapplied


def endpoints(result: planner.Plan) -> list[list[str]] | None:
    found = [a.manifest for a in result.actions if isinstance(a, planner.ApplyObject)]
    return [e["addresses"] for e in found[0]["endpoints"]] if found else None


def signed_status(**extra) -> dict:
    return running_status(ownedPods=[], **extra)


def test_the_service_routes_to_the_store_pod_the_operator_made():
    result = planner.plan(job(signed_status()), observed([rdzv(ip="10.244.1.7"), worker(0), worker(1)]), NOW)
    assert endpoints(result) == [["10.244.1.7"]]


def test_a_store_on_its_way_out_is_routed_to_no_more():
    going = rdzv(ip="10.244.1.7", deleting=True)
    assert endpoints(planner.plan(job(signed_status()), observed([going, worker(0)]), NOW)) == []
    assert endpoints(planner.plan(job(signed_status()), observed([worker(0)]), NOW)) == []


def test_a_job_started_before_pods_were_signed_keeps_its_selector():
    result = planner.plan(job(running_status()), observed([rdzv(ip="10.244.1.7"), worker(0), worker(1)]), NOW)
    assert endpoints(result) is None


def test_no_service_no_endpoints():
    result = planner.plan(job(signed_status()), observed([rdzv(ip="10.244.1.7")], service=None), NOW)
    assert endpoints(result) is None


def test_the_endpoints_are_written_only_when_they_change():
    applied: dict = {}
    empty = planner.plan(job(signed_status()), observed([worker(0)]), NOW).actions
    assert not [a for a in unapplied(applied, empty) if isinstance(a, planner.ApplyObject)]  # nothing to undo
    first = planner.plan(job(signed_status()), observed([rdzv(ip="10.244.1.7"), worker(0)]), NOW).actions
    sent = [a for a in unapplied(applied, first) if isinstance(a, planner.ApplyObject)]
    assert len(sent) == 1
    remember_applied(applied, sent)
    again = planner.plan(job(signed_status()), observed([rdzv(ip="10.244.1.7"), worker(0)]), NOW).actions
    assert not [a for a in unapplied(applied, again) if isinstance(a, planner.ApplyObject)]
    assert len([a for a in unapplied(applied, empty) if isinstance(a, planner.ApplyObject)]) == 1  # taken back
