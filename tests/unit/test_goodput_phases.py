"""The seconds lost per phase of one incident, from the moments seen (planner/goodput.py): a table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from elasticjob.models import LostPhases
from elasticjob.planner import goodput
from elasticjob.planner.goodput import Marks

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float | None) -> datetime | None:
    return None if seconds is None else T0 + timedelta(seconds=seconds)


def marks(detected=0.5, replaced=None, round=None, loading=None, loaded=None, first_step=None, loaded_step=None,
          last_step=None, step_seconds=None) -> Marks:
    return Marks(start=T0, detected=at(detected), replaced=at(replaced), round=at(round), loading=at(loading),
                 loaded=at(loaded), first_step=at(first_step), loaded_step=loaded_step, last_step=last_step,
                 step_seconds=step_seconds)


@pytest.mark.parametrize(("seen", "expected"), [
    pytest.param(marks(0.5, 2.5, 3.0, 4.0, 5.5, 5.7, loaded_step=20, last_step=27, step_seconds=0.1),
                 LostPhases(detect=0.5, replace=2.0, rendezvous=0.5, worker_start=1.0, checkpoint_load=1.5,
                            recompute=0.7), id="every-phase-seen"),
    pytest.param(marks(0.5, 2.5, 3.0), LostPhases(detect=0.5, replace=2.0, rendezvous=0.5),
                 id="no-progress-api-the-rest-unknown"),
    pytest.param(marks(0.5, 2.5, 3.0, loaded=5.5, first_step=5.7, loaded_step=20, last_step=27, step_seconds=0.1),
                 LostPhases(detect=0.5, replace=2.0, rendezvous=0.5, worker_start=2.5, recompute=0.7),
                 id="no-loading-call-worker-start-runs-to-the-load's-end"),
    pytest.param(marks(0.5, 2.5, 3.0, first_step=4.0), LostPhases(detect=0.5, replace=2.0, rendezvous=0.5,
                                                                  worker_start=1.0),
                 id="steps-without-checkpoint-reports"),
    pytest.param(marks(0.5, 3.0, 2.0, first_step=4.0), LostPhases(detect=0.5, replace=2.5, rendezvous=0.0,
                                                                  worker_start=1.0),
                 id="round-seen-before-the-pods-costs-nothing-more"),
    pytest.param(marks(0.5, 0.5, 1.2, 1.5, 2.0, 2.1, loaded_step=30, last_step=30, step_seconds=0.1),
                 LostPhases(detect=0.5, replace=0.0, rendezvous=0.7, worker_start=0.3, checkpoint_load=0.5,
                            recompute=0.0), id="in-place-restart-saved-at-the-fault"),
    pytest.param(marks(0.5, 2.5, 3.0, 4.0, 5.5, None, loaded_step=20, last_step=27, step_seconds=0.1),
                 LostPhases(detect=0.5, replace=2.0, rendezvous=0.5), id="not-stepping-yet-the-rest-open"),
    pytest.param(marks(0.5, 2.5, 3.0, 4.0, 5.5, 5.7, loaded_step=30, last_step=27, step_seconds=0.1),
                 LostPhases(detect=0.2, replace=2.0, rendezvous=0.5, worker_start=1.0, checkpoint_load=1.5,
                            recompute=0.0), id="a-checkpoint-past-the-fault-recomputes-nothing-and-trained-to-it"),
    pytest.param(marks(1.6, None, None, 1.2, 1.3, 1.9, loaded_step=8, last_step=11, step_seconds=0.1),
                 LostPhases(detect=1.3, replace=0.0, rendezvous=0.0, worker_start=0.0, checkpoint_load=0.0,
                            recompute=0.3), id="stepping-again-before-the-operator-saw-the-pods-or-the-round"),
    # Seen in a worker's kill: the survivors loaded at 2.0 s, stepped at 2.2 s; the failure was booked at 2.3 s
    # and the replacement ran at 3.3 s. Nothing after the load was lost.
    pytest.param(marks(2.3, 3.3, 3.3, 1.8, 2.0, 2.2, loaded_step=940, last_step=942, step_seconds=0.1),
                 LostPhases(detect=2.0, replace=0.0, rendezvous=0.0, worker_start=0.0, checkpoint_load=0.0,
                            recompute=0.2), id="the-operator's-marks-after-the-training's-count-nothing"),
    # A restart torch made with SIGTERM: the workers saved step 30 on their way out, 0.9 s of steps after the
    # report the fault was dated from (step 21). Those steps were not lost.
    pytest.param(marks(0.0, 0.0, 1.5, 1.8, 2.0, 2.2, loaded_step=30, last_step=21, step_seconds=0.1),
                 LostPhases(detect=0.0, replace=0.0, rendezvous=0.6, worker_start=0.3, checkpoint_load=0.2,
                            recompute=0.0), id="a-checkpoint-saved-after-the-report-moves-the-fault-to-it"),
])
def test_phases(seen, expected):
    assert goodput.phases(seen) == expected


def test_the_phases_add_up_to_the_time_from_the_fault_to_the_load_plus_the_recompute():
    found = goodput.phases(marks(0.5, 2.5, 3.0, 4.0, 5.5, 5.7, loaded_step=20, last_step=27, step_seconds=0.1))
    assert goodput.lost(found) == pytest.approx(5.5 + 0.7)
    assert goodput.biggest(found) == ("replace", 2.0)
    assert goodput.biggest(LostPhases()) is None


@pytest.mark.parametrize(("step", "step_at", "step_seconds", "expected"), [
    (100, -0.5, 0.1, 105),  # reported half a second before the fault: five more steps done
    (100, -30.0, 0.1, 150),  # an old report is carried at most MAX_CARRY_SECONDS
    (100, 0.5, 0.1, 100),  # a report after the fault is the step itself
    (100, -0.5, None, 100),
    (None, -0.5, 0.1, None),
])
def test_step_at_fault(step, step_at, step_seconds, expected):
    assert goodput.step_at_fault(step, at(step_at), step_seconds, T0) == expected


@pytest.mark.parametrize(("wall", "lost", "expected"), [(100.0, 4.0, 96.0), (0.0, 0.0, None), (10.0, 20.0, 0.0)])
def test_ettr(wall, lost, expected):
    assert goodput.ettr(wall, lost) == expected
