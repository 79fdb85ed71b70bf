"""What an earlier job of the same name left behind: the garbage collector's turn first, then the operator's."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from factory import NOW, job, observed, rdzv

from elasticjob import planner

OLD = planner.Leftover("Pod", "train-worker-0", "uid-old-w0", "old-job-uid")
OLD_SERVICE = planner.Leftover("Service", "train-rdzv", "uid-old-svc", "old-job-uid")


def collected(result: planner.Plan) -> list[tuple[str, str, str]]:
    return [(a.leftover.kind, a.leftover.name, a.leftover.uid) for a in result.actions
            if isinstance(a, planner.CollectLeftover)]


@pytest.mark.parametrize("age, expected", [
    (5, []),  # the garbage collector usually acts within a second
    (29, []),
    (31, [("Pod", "train-worker-0", "uid-old-w0"), ("Service", "train-rdzv", "uid-old-svc")]),
])
def test_leftovers_are_removed_only_after_the_garbage_collector_had_its_turn(age, expected):
    young = replace(job(), created=NOW - timedelta(seconds=age))
    result = planner.plan(young, observed([rdzv()], leftovers=[OLD, OLD_SERVICE]), NOW)
    assert collected(result) == expected
    if not expected:
        assert result.requeue_after <= 30 - age + 1  # it looks again when the grace ends, not at the resync


def test_each_removal_says_whose_it_was():
    result = planner.plan(replace(job(), created=NOW - timedelta(minutes=2)),
                          observed([rdzv()], leftovers=[OLD]), NOW)
    (action,) = [a for a in result.actions if isinstance(a, planner.CollectLeftover)]
    assert action.leftover == OLD
    assert action.event.reason == "DeletedLeftover" and "old-job-uid" in action.event.message


def test_nothing_is_removed_without_leftovers_or_a_creation_time():
    assert collected(planner.plan(replace(job(), created=NOW - timedelta(minutes=2)), observed([rdzv()]), NOW)) == []
    assert collected(planner.plan(job(), observed([rdzv()], leftovers=[OLD]), NOW)) == []
