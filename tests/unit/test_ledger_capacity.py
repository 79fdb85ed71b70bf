"""Goodput that counts capacity (planner/capacity.py): seconds trained with fewer nodes than wanted count by the
share missing, outside incidents; the stretch is written when it begins and ends, never every second."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import factory
import pytest
from factory import NOW, observed, rdzv, running_status, worker
from test_ledger_partition import IP, SINCE, fresh, report, seconds, silent, step

from elasticjob import planner
from elasticjob.models import ElasticJobStatus, GoodputStatus, Incident
from elasticjob.observe import StoreNode, StoreView
from elasticjob.planner import capacity
from elasticjob.planner.base import precise


def ledger() -> GoodputStatus:
    """600 s in, nothing lost yet."""
    return GoodputStatus(since=precise(NOW - timedelta(seconds=600)))


def at(value: float):
    return NOW + timedelta(seconds=value)


# Each case: the (nodes, desired) seen at each second given (None: the store does not say), and the seconds short
# of size, weighted, added up by the end (the stretch still going at the end is folded there, as a finish does).
CASES = {
    "at full size: nothing": ([(0, 3, 3), (10, 3, 3)], 0.0),
    "2 of 3 for 9 s": ([(0, 2, 3), (9, 3, 3), (20, 3, 3)], 3.0),
    "1 of 3 for 3 s, then 2 of 3 for 6 s": ([(0, 1, 3), (3, 2, 3), (9, 3, 3)], 4.0),
    "scaled down to the nodes it has: over": ([(0, 2, 3), (6, 2, 2), (30, 2, 2)], 2.0),
    "the store silent meanwhile: the stretch goes on": ([(0, 2, 4), (4, None, 4), (8, 4, 4)], 4.0),
    "still short at the end": ([(0, 3, 4), (12, 3, 4)], 3.0),
}


@pytest.mark.parametrize("seen, lost", CASES.values(), ids=CASES.keys())
def test_seconds_short_of_size_count_by_the_share_missing(seen, lost):
    found = ledger()
    for second, nodes, desired in seen:
        capacity.follow(found, nodes, desired, at(second))
    capacity.fold(found, at(seen[-1][0]))
    assert found.capacity_lost_seconds == lost and found.short_of_size is None


def test_the_stretch_is_written_when_it_begins_and_ends_only():
    found = ledger()
    capacity.follow(found, 2, 3, at(0))
    begun = found.model_copy(deep=True)
    capacity.follow(found, 2, 3, at(5))
    assert found == begun, "the same size seen again changes nothing in the status"
    assert found.short_of_size.since == precise(at(0)) and found.capacity_lost_seconds == 0.0


def test_an_incident_takes_over_from_its_start_so_no_second_counts_twice():
    found = ledger()
    capacity.follow(found, 2, 4, at(0))
    found.open_incident = Incident(kind="WorkerLost", start_time=precise(at(8)))
    capacity.fold(found, min(at(10), capacity.parse(found.open_incident.start_time)))
    assert found.capacity_lost_seconds == 4.0, "8 s at half the nodes, up to the incident's start"
    assert found.wall_seconds == 608.0 and found.goodput_percent == 100.0
    assert capacity.weighted(found) == round(100 * (608 - 4) / 608, 2)


def job_status(**goodput) -> ElasticJobStatus:
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=3))
    status.goodput = GoodputStatus(since=precise(SINCE), **goodput)
    return status


def plan_with(status: ElasticJobStatus, nodes: int, at_second: float, round: int = 4):
    participants = tuple(StoreNode(IP[i], 0.5) for i in range(nodes))
    store = StoreView(epoch="e1", round=round, complete=True, participants=participants,
                      received_at=seconds(at_second))
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    pods = [worker(i) for i in range(3)]
    return planner.plan(job, observed([*pods, rdzv()], store=store), seconds(at_second))


def test_through_the_planner_a_round_of_2_of_3_opens_a_stretch_and_its_end_books_it():
    status = job_status(round=4, epoch="e1")
    plan = plan_with(status, 2, 0.0)
    assert plan.status.goodput.short_of_size.nodes == 2 and plan.status.goodput.open_incident is None
    plan = plan_with(plan.status, 2, 6.0)
    assert plan.status.goodput.capacity_lost_seconds == 0.0
    plan = plan_with(plan.status, 3, 9.0, round=5)  # the third joined: torch restarts the group (a Rejoin)
    found = plan.status.goodput
    assert [i.kind for i in found.last_incidents] == ["Rejoin"], "without progress reports it closes at the round"
    assert found.short_of_size is None and found.capacity_lost_seconds == 3.0
    assert found.weighted_goodput_percent < found.goodput_percent
    said = [e.message for e in plan.events if e.reason == "ShortOfSizeEnded"]
    assert said == ["the training ran at 2 of 3 nodes since 2026-01-01T12:00:00.000Z: 3.0 s of capacity lost"]


def test_a_partition_leaves_the_survivors_short_until_the_replacement_joins():
    others = [worker(0), worker(2)]
    status = job_status(progress_reported=True)
    plan = step(status, [*others, worker(1)], 6.5, silent(6.5), 4, report())
    assert plan.status.goodput.open_incident.kind == "Partition"
    survivors = [StoreNode(IP[0], 0.5), StoreNode(IP[2], 0.5)]
    plan = step(plan.status, others, 8.5, survivors, 5, fresh(6.5))  # the survivors step again: it closes
    found = plan.status.goodput
    assert found.open_incident is None and found.incidents == 1
    assert found.short_of_size is not None and (found.short_of_size.nodes, found.short_of_size.desired) == (2, 3)
    everyone = [StoreNode(IP[i], 0.5) for i in range(3)]
    stepping = replace(fresh(6.5), step=560, step_at=seconds(14.0))  # the survivors' last step before the join
    plan = step(plan.status, [*others, worker(1, uid="uid-w1b")], 14.5, everyone, 6, stepping)
    found = plan.status.goodput
    assert found.open_incident.kind == "Rejoin" and found.open_incident.start_time == precise(seconds(14.0))
    assert found.short_of_size is None
    assert found.capacity_lost_seconds == round(5.5 / 3, 3), "from the close (8.5 s) to the Rejoin's start, a third"
    assert found.weighted_goodput_percent < found.goodput_percent
