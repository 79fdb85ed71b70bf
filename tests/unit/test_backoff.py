"""The retry schedules: a failing reconcile waits 1 s, doubling, at most 5 minutes."""

from __future__ import annotations

import pytest

from elasticjob import backoff


@pytest.mark.parametrize(("attempt", "wait"), [
    (-1, 1), (0, 1), (1, 2), (2, 4), (3, 8), (7, 128), (8, 256), (9, 300), (10, 300), (1000, 300),
])
def test_a_failing_reconcile_waits_longer_each_time_up_to_five_minutes(attempt, wait):
    assert backoff.step(backoff.RECONCILE_FAILED, attempt) == wait


@pytest.mark.parametrize("schedule", [backoff.RECONCILE_FAILED, backoff.REFUSED_CREATE, backoff.STORE_POLL])
def test_a_schedule_never_shortens(schedule):
    assert list(schedule) == sorted(schedule)
