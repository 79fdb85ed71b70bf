"""A partitioned worker through the planner: its heartbeats go stale, the operator cuts it off (recovery.py),
the survivors re-form and step again; the ledger books one Partition incident from the training's last step
(or the agent's last heartbeat), and its phases add up."""

from __future__ import annotations

from datetime import timedelta

import factory
import pytest
from factory import NOW, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.models import ElasticJobStatus, GoodputStatus
from elasticjob.observe import NodeCheckView, ProgressView, StoreNode, StoreView
from elasticjob.planner.goodput import PHASE_NAMES

SINCE = NOW - timedelta(seconds=600)
IP = {i: f"10.244.0.{10 + i}" for i in range(3)}


def seconds(value: float):
    return NOW + timedelta(seconds=value)


def running(progress: bool) -> ElasticJobStatus:
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=3))
    status.goodput = GoodputStatus(since=SINCE.strftime("%Y-%m-%dT%H:%M:%S.000Z"), progress_reported=progress)
    return status


def report(**fields) -> ProgressView:
    """Rank 0 (worker 0, a survivor): its last step at 0.4 s, after worker 1's last heartbeat at 0 s."""
    base = dict(pod="train-worker-0", started_at=SINCE, step=500, step_at=seconds(0.4), step_seconds=0.1,
                first_step=1, first_step_at=SINCE + timedelta(seconds=5), saved_step=490, saved_at=seconds(-0.5))
    return ProgressView(**{**base, **fields})


def fresh(at: float) -> ProgressView:
    """The survivors' new worker processes, restarted at `at`: loading step 490 0.5 s later, stepping at +1.5 s."""
    return report(started_at=seconds(at + 0.2), step=491, step_at=seconds(at + 1.5), first_step=491,
                  first_step_at=seconds(at + 1.5), loading_at=seconds(at + 0.5), loaded_step=490,
                  loaded_at=seconds(at + 1.0), saved_step=None, saved_at=None)


def step(status: ElasticJobStatus, pods, at: float, participants, round: int, progress, nodes=None):
    # Every agent checked its node when the job started: the survivors restart in place, none checks again.
    checks = tuple(NodeCheckView(node.addr, 0.4, SINCE) for node in participants)
    store = StoreView(epoch="e1", round=round, complete=True, participants=tuple(participants),
                      received_at=seconds(at), progress=progress, node_checks=checks)
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    return planner.plan(job, observed([*pods, rdzv()], store=store, nodes=nodes or {}), seconds(at))


def silent(at: float) -> list[StoreNode]:
    """Worker 1 heartbeated last at 0 s; the others just now."""
    return [StoreNode(IP[0], 0.5), StoreNode(IP[1], at, True), StoreNode(IP[2], 0.5)]


# (what the operator saw, worker 1 as it sees it, the nodes' readiness, when it cuts it off, whether it stops it)
CASES = {
    "pod Ready: the store's word alone": ("NoHeartbeat", {}, {}, 6.5, False),
    "pod not ready": ("PodNotReady", {"ready": False}, {}, 3.0, True),
    "node not Ready": ("NodeNotReady", {"node": "node-b"}, {"node-b": False}, 3.0, True),
}


@pytest.mark.parametrize("reason, seen, nodes, detect, fenced", CASES.values(), ids=CASES.keys())
def test_a_partition_is_one_incident_from_the_last_step_whose_phases_add_up(reason, seen, nodes, detect, fenced):
    others = [worker(0), worker(2)]
    # Silent, but within one missed heartbeat (1.5 s of 1 s keep-alives): nothing is booked.
    plan = step(running(True), [*others, worker(1, **seen)], 1.2, silent(1.2), 4, report(), nodes)
    assert plan.status.goodput.open_incident is None and not plan.cut_off
    # The cut-off: removed from the rendezvous, the survivors restarted.
    plan = step(plan.status, [*others, worker(1, **seen)], detect, silent(detect), 4, report(), nodes)
    incident = plan.status.goodput.open_incident
    assert (incident.kind, incident.reason, incident.pod) == ("Partition", reason, "train-worker-1")
    assert incident.start_time == "2026-01-01T12:00:00.400Z", "rank 0's last step, after the last heartbeat"
    assert incident.detected_time is not None and incident.last_step == 500
    assert [r.reason for r in plan.status.last_failures] == (["Partitioned"] if fenced else [])
    # A fenced pod is going; one left running is out of the rendezvous but still runs.
    cut = worker(1, **seen, deleting=True) if fenced else worker(1, **seen)
    survivors = [StoreNode(IP[0], 0.5), StoreNode(IP[2], 0.5)]
    plan = step(plan.status, [*others, cut], detect + 1.0, survivors, 5, report(), nodes)
    assert plan.status.goodput.open_incident is not None, "the training has not stepped since"
    plan = step(plan.status, [*others, cut], detect + 3.0, survivors, 5, fresh(detect), nodes)
    # Fenced, its pod ends later as the cluster reports it (the node's taint manager): the same fault.
    gone = worker(1, "Failed", **seen, deleting=True, exit_code=137, disruption="NodeLost",
                  finished_at=seconds(detect + 3.5)) if fenced else cut
    plan = step(plan.status, [*others, gone], detect + 4.0, survivors, 5, fresh(detect), nodes)
    ledger = plan.status.goodput
    assert ledger.open_incident is None and ledger.incidents == 1
    closed = ledger.last_incidents[-1]
    assert closed.kind == "Partition"
    phases = closed.phases.model_dump()
    assert None not in phases.values(), phases
    # The phases tile the time from the last step (0.4 s) to the checkpoint loaded, then the steps done again.
    assert round(sum(phases[name] for name in PHASE_NAMES[:-1]), 3) == round(detect + 1.0 - 0.4, 3)
    assert phases["detect"] == round(detect - 0.4, 3) and phases["recompute"] == 1.0
    assert closed.lost_seconds == round(sum(phases.values()), 3)


def test_without_a_step_reported_since_the_last_heartbeat_starts_the_partition():
    others, cut = [worker(0), worker(2)], worker(1)
    stale = report(step_at=seconds(-3.0))  # rank 0's last report came before the last heartbeat
    plan = step(running(True), [*others, cut], 6.5, silent(6.5), 4, stale)
    assert plan.status.goodput.open_incident.start_time == "2026-01-01T12:00:00.000Z"


def test_a_partition_without_progress_reports_closes_once_the_group_re_formed():
    others, cut = [worker(0), worker(2)], worker(1)
    plan = step(running(False), [*others, cut], 6.5, silent(6.5), 4, None)
    assert plan.status.goodput.open_incident.start_time == "2026-01-01T12:00:00.000Z"
    survivors = [StoreNode(IP[0], 0.5), StoreNode(IP[2], 0.5)]
    plan = step(plan.status, [*others, cut], 8.0, survivors, 5, None)
    closed = plan.status.goodput.last_incidents[-1]
    assert (closed.kind, closed.lost_seconds) == ("Partition", 8.0)
    assert closed.phases.wire() == {"detect": 6.5, "replace": 0.0, "nodeCheck": 0.0, "rendezvous": 1.5}
