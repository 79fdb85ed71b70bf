"""Whom the job's store answers (planner/peers.py): the operator names its own view of the job's pods to the store's
gate whenever the gate holds another list, never what the store says; refusals shown once each. Table tests
through planner.plan, with the orderings the controller can see: the same answer twice, a store that restarted
with an empty list, a pod gone, a store without a gate, the status write lost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import NOW, job, observed, rdzv, running_status, store, worker

from elasticjob import planner
from elasticjob.observe import PeersView
from elasticjob_store.protocol import Peers

POD_IPS = ("10.244.0.10", "10.244.0.11")


def pods(n: int = 2, **fields):
    return [rdzv(), *(worker(i, **fields) for i in range(n))]


def told(result: planner.Plan) -> list[tuple[str, ...]]:
    return [a.request.addresses for a in result.actions
            if isinstance(a, planner.StoreAction) and isinstance(a.request, Peers)]


def plan(peers: PeersView | None, workers=None, status=None):
    seen = observed(workers if workers is not None else pods(), store=store(peers=peers))
    return planner.plan(job(status or running_status()), seen, NOW)


@pytest.mark.parametrize(("gate", "expected"), [
    (PeersView(told=False, allowed=()), [POD_IPS]),  # a new store: told at once
    (PeersView(told=True, allowed=()), [POD_IPS]),  # told before, every pod since gone and come back
    (PeersView(told=True, allowed=("10.244.0.10",)), [POD_IPS]),  # a pod added
    (PeersView(told=True, allowed=(*POD_IPS, "10.244.0.99")), [POD_IPS]),  # a pod gone: its address taken off
    (PeersView(told=True, allowed=POD_IPS), []),  # as it should be: nothing sent
    (None, []),  # a store without a gate (--no-store-peer-check, an older store): nothing to tell
])
def test_the_store_is_told_the_job_pods_whenever_its_list_differs(gate, expected):
    assert told(plan(gate)) == expected


def test_the_list_is_the_operators_own_view_of_the_pods_not_the_stores():
    # The store lists a stranger's address as allowed and reports agents at others: the operator names only
    # the pods it made, running or on their way out, and a pod without an IP yet is not named.
    workers = [rdzv(), worker(0), worker(1, deleting=True), worker(2, phase="Pending", ip=None)]
    gate = PeersView(told=True, allowed=("10.9.9.9",))
    assert told(plan(gate, workers)) == [POD_IPS]


def test_the_request_goes_to_the_stores_control_port():
    action = next(a for a in plan(PeersView(told=False, allowed=())).actions if isinstance(a, planner.StoreAction))
    assert action.endpoint.port == 29401


def test_refusals_are_shown_once_each_and_a_restarted_store_counts_anew():
    first = plan(PeersView(told=True, allowed=POD_IPS, refused=3, last_refused=("10.1.0.5", "10.1.0.6")))
    warnings = [e for e in first.events if e.reason == "StorePeerRefused"]
    assert len(warnings) == 1 and "3 connection(s) from 10.1.0.5, 10.1.0.6" in warnings[0].message
    assert first.status.rendezvous.refused_peers == 3
    status = first.status.model_dump(by_alias=True, mode="json")
    same = planner.plan(job(status), observed(pods(), store=store(
        peers=PeersView(told=True, allowed=POD_IPS, refused=3, last_refused=("10.1.0.6",)))), NOW + timedelta(seconds=1))
    assert "StorePeerRefused" not in [e.reason for e in same.events]  # the same answer again: no new Event
    restarted = planner.plan(job(status), observed(pods(), store=store(
        epoch="e2", peers=PeersView(told=False, allowed=(), refused=1, last_refused=("10.1.0.7",)))), NOW)
    assert restarted.status.rendezvous.refused_peers == 1
    assert "StorePeerRefused" not in [e.reason for e in restarted.events]  # 1 < 3: counted anew, not shown twice
    lost_write = planner.plan(job(running_status()), observed(pods(), store=store(
        peers=PeersView(told=True, allowed=POD_IPS, refused=3, last_refused=("10.1.0.6",)))), NOW)
    assert [e.reason for e in lost_write.events].count("StorePeerRefused") == 1  # shown again, not lost
