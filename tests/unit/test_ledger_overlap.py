"""Two faults close together: one that began after the open incident's training stepped again is an incident of
its own, booked once that one closes; one that began before is part of it (its time is that one's)."""

from __future__ import annotations

import factory
import pytest
from factory import observed, rdzv, worker
from test_ledger_rejoin import IP, accounted, seconds

from elasticjob import planner
from elasticjob.models import ElasticJobStatus, GoodputStatus, Incident
from elasticjob.observe import ProgressView, StoreNode, StoreView
from elasticjob.planner import ledger
from elasticjob.planner.base import precise

PARTICIPANTS = tuple(StoreNode(IP[i], 0.5) for i in range(3))


def world_of_one() -> ProgressView:
    """Round 0's process, alone: stepped to 4 by -0.5 s."""
    return ProgressView(pod="train-worker-0", started_at=seconds(-3.0), step=4, step_at=seconds(-0.5),
                        step_seconds=0.1, first_step=1, first_step_at=seconds(-2.0), received_at=seconds(-0.5))


def joined_process(step: int, at: float) -> ProgressView:
    """Round 1's process: began at 0.1 s, loaded step 4, stepped first at 1.1 s, then every 0.1 s."""
    return ProgressView(pod="train-worker-0", started_at=seconds(0.1), step=step, step_at=seconds(at),
                        step_seconds=0.1, first_step=5, first_step_at=seconds(1.1), loading_at=seconds(0.3),
                        loaded_step=4, loaded_at=seconds(0.6), received_at=seconds(at))


def plan_at(status: ElasticJobStatus, at: float, store: StoreView | None, store_ready: bool = True):
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    pods = [worker(0), worker(1), worker(2), rdzv(ready=store_ready)]
    return planner.plan(job, observed(pods, store=store), seconds(at))


def round_one(epoch: str, progress: ProgressView | None, at: float) -> StoreView:
    return StoreView(epoch=epoch, round=1, complete=True, participants=PARTICIPANTS, received_at=seconds(at),
                     progress=progress, round_completed_at=seconds(-0.1))


def store_killed_at(kill: float) -> list[tuple[str, float]]:
    """An agent joined round 0's one (round 1, seen at 0 s: a Rejoin); the store is killed at `kill` and seen
    lost 0.1 s later; its agents resume round 1 on the store that came back, and the training steps on there."""
    status = accounted(round=0)
    status.rendezvous.last_lost_time = None
    plan = plan_at(status, 0.0, round_one("e1", world_of_one(), 0.0))
    assert plan.status.goodput.open_incident.kind == "Rejoin"
    begun = ProgressView(pod="train-worker-0", started_at=seconds(0.1), step_seconds=0.1, received_at=seconds(0.1))
    plan = plan_at(plan.status, 0.2, round_one("e1", begun, 0.2))
    plan = plan_at(plan.status, kill + 0.1, None, store_ready=False)
    assert plan.status.rendezvous.last_lost_time is not None, "the store's loss is seen"
    for at in (kill + 1.0, kill + 1.5):
        plan = plan_at(plan.status, at, round_one("e2", joined_process(round(10 * at), at), at))
    ledger = plan.status.goodput
    assert ledger.open_incident is None and not ledger.queued_incidents, ledger
    return [(i.kind, i.lost_seconds) for i in ledger.last_incidents]


def test_a_store_killed_after_the_rejoined_process_stepped_is_its_own_incident_at_0_s():
    # Seen in CI: the store was killed 0.2 s after the new process's first step, before the operator saw it.
    booked = store_killed_at(1.3)
    assert [kind for kind, _ in booked] == ["Rejoin", "StoreLost"], booked
    assert booked[1] == ("StoreLost", 0.0), booked
    assert booked[0][1] == 1.1, booked  # from round 0's last step (-0.5 s) to the checkpoint loaded (0.6 s)


def test_a_store_killed_before_the_rejoined_process_stepped_is_part_of_the_rejoin():
    # Its time is the Rejoin's: booked once, in it.
    booked = store_killed_at(0.8)
    assert booked == [("Rejoin", 1.1)], booked


def incident(kind: str, start: float) -> Incident:
    return Incident(kind=kind, start_time=precise(seconds(start)), detected_time=precise(seconds(start + 0.1)))


@pytest.mark.parametrize(("queued", "end", "opened", "still_queued"), [
    ([("StoreLost", 2.0)], 1.0, "StoreLost", []),  # began after the training stepped again: its own
    ([("WorkerLost", 0.5)], 1.0, None, []),  # began before: part of the one that closed
    ([("WorkerLost", 0.5), ("StoreLost", 2.0), ("ScaleChange", 3.0)], 1.0, "StoreLost", ["ScaleChange"]),
    ([("StoreLost", 2.0)], None, None, []),  # the job finished, or the incident was given up
])
def test_the_next_incident_after_one_closed(queued, end, opened, still_queued):
    goodput = GoodputStatus(queued_incidents=[incident(*q) for q in queued])
    ledger.open_next(goodput, seconds(end) if end is not None else None)
    assert (goodput.open_incident.kind if goodput.open_incident else None) == opened
    assert [q.kind for q in goodput.queued_incidents] == still_queued
