"""A restart no booked fault explains: an agent joins the running group (a lost pod's replacement, one back from a
partition) and torch restarts every worker to let it in. The ledger books it as a Rejoin from the training's last
step, and a lost pod whose agent was taken out already books nothing more."""

from __future__ import annotations

from datetime import timedelta

import factory
from factory import NOW, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.models import ElasticJobStatus, FailureRecord, GoodputStatus, Incident
from elasticjob.observe import ProgressView, StoreNode, StoreView

SINCE = NOW - timedelta(seconds=600)
IP = {i: f"10.244.0.{10 + i}" for i in range(3)}


def seconds(value: float):
    return NOW + timedelta(seconds=value)


def accounted(round: int = 5, epoch: str = "e1", **fields) -> ElasticJobStatus:
    """Training on in round 5 of the store's epoch e1, nothing open."""
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=3, **fields))
    status.goodput = GoodputStatus(since=SINCE.strftime("%Y-%m-%dT%H:%M:%S.000Z"), progress_reported=True,
                                   round=round, epoch=epoch)
    status.rendezvous.round, status.rendezvous.epoch = round, epoch
    return status


def old_process(step_at: float = 0.4) -> ProgressView:
    return ProgressView(pod="train-worker-0", started_at=SINCE, step=800, step_at=seconds(step_at),
                        step_seconds=0.1, first_step=1, first_step_at=SINCE + timedelta(seconds=5))


def new_process(at: float) -> ProgressView:
    """The restarted workers: started at `at`, step 790 loaded 0.5 s later, the first step 1 s after that."""
    return ProgressView(pod="train-worker-0", started_at=seconds(at), step=791, step_at=seconds(at + 1.5),
                        step_seconds=0.1, first_step=791, first_step_at=seconds(at + 1.5),
                        loading_at=seconds(at + 0.2), loaded_step=790, loaded_at=seconds(at + 0.5))


def step(status: ElasticJobStatus, at: float, round: int, progress, nodes: int = 3, epoch: str = "e1",
         complete: bool = True, pods=None):
    store = StoreView(epoch=epoch, round=round, complete=complete, received_at=seconds(at), progress=progress,
                      participants=tuple(StoreNode(IP[i], 0.5) for i in range(nodes)))
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    pods = pods if pods is not None else [worker(0), worker(1), worker(2)]
    return planner.plan(job, observed([*pods, rdzv()], store=store), seconds(at))


def test_an_agent_joining_the_running_group_is_a_rejoin_from_the_last_step():
    # Round 6 completed with the joiner: every worker restarted, the training's last report is from before.
    plan = step(accounted(), 1.2, 6, old_process())
    incident = plan.status.goodput.open_incident
    assert (incident.kind, incident.reason) == ("Rejoin", "AgentJoined")
    assert incident.start_time == "2026-01-01T12:00:00.400Z" and incident.last_step == 800
    assert plan.status.goodput.round == 6
    plan = step(plan.status, 2.0, 6, old_process())
    assert plan.status.goodput.open_incident is not None, "no step since"
    plan = step(plan.status, 3.5, 6, new_process(1.5))
    ledger = plan.status.goodput
    assert ledger.open_incident is None and ledger.incidents == 1
    closed = ledger.last_incidents[-1]
    # From the last step (0.4 s): the group re-formed when seen (1.2 s), the new processes loading from 1.7 s,
    # loaded at 2.0 s, ten steps done again.
    assert closed.phases.wire() == {"detect": 0.0, "replace": 0.0, "rendezvous": 0.8, "workerStart": 0.5,
                                    "checkpointLoad": 0.3, "recompute": 1.0}
    assert closed.lost_seconds == 2.6


def test_a_rejoin_of_a_script_that_reports_no_steps_starts_when_its_round_began_to_form():
    """A plain torchrun script: no step is reported, so the pause is bound by the store's marks: the round before
    broke up at 0.3 s (an agent left it to re-form), the new one completed at 1.0 s, seen at 1.2 s. It was booked
    0.0 s before (from the completion as seen); the rest stays unknown, never 0."""
    status = accounted()
    status.goodput.progress_reported = False
    store = StoreView(epoch="e1", round=6, complete=True, received_at=seconds(1.2),
                      participants=tuple(StoreNode(IP[i], 0.5) for i in range(3)),
                      round_completed_at=seconds(1.0), round_forming_since=seconds(0.3))
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    plan = planner.plan(job, observed([worker(0), worker(1), worker(2), rdzv()], store=store), seconds(1.2))
    closed = plan.status.goodput.last_incidents[-1]
    assert (closed.kind, closed.start_time) == ("Rejoin", "2026-01-01T12:00:00.300Z")
    assert closed.lost_seconds == 0.9 and closed.phases.rendezvous == 0.9
    assert closed.phases.worker_start is None and closed.phases.recompute is None, "not seen: unknown"
    # A mark from longer ago than a round can take to form is not this pause's: the completion is.
    stale = StoreView(**{**store.__dict__, "round_forming_since": seconds(-600)})
    plan = planner.plan(job, observed([worker(0), worker(1), worker(2), rdzv()], store=stale), seconds(1.2))
    assert plan.status.goodput.last_incidents[-1].start_time == "2026-01-01T12:00:01.000Z"


def test_no_rejoin_without_a_new_complete_round_of_the_same_store():
    assert step(accounted(), 1.0, 5, old_process()).status.goodput.open_incident is None, "the same round"
    assert step(accounted(), 1.0, 6, old_process(), complete=False).status.goodput.open_incident is None, \
        "still forming: counted once it completes"
    first = accounted()
    first.goodput.round = first.goodput.epoch = None  # a ledger from before rounds were accounted
    assert step(first, 1.0, 6, old_process()).status.goodput.open_incident is None


def test_a_round_completing_inside_an_incident_is_that_incident():
    status = accounted()
    # A scale-up opened its own incident; its round completing is part of it, and is accounted.
    status.desired_replicas = 2
    plan = step(status, 1.0, 6, old_process())
    ledger = plan.status.goodput
    assert ledger.open_incident.kind == "ScaleChange" and ledger.round == 6
    plan = step(plan.status, 3.5, 6, new_process(1.5))
    assert plan.status.goodput.incidents == 1 and plan.status.goodput.open_incident is None
    assert step(plan.status, 5.0, 6, new_process(1.5)).status.goodput.open_incident is None


def test_a_report_too_old_to_be_this_restarts_starts_it_when_seen():
    plan = step(accounted(), 10.0, 6, old_process(step_at=2.0))
    assert plan.status.goodput.open_incident.start_time == "2026-01-01T12:00:10.000Z"


def test_a_lost_pod_whose_agent_was_taken_out_already_books_nothing_more():
    # Worker 1's node went; its agent was taken out (TrainingStalled) and the two others train on. The node is
    # declared lost later and the pod ends: nothing more is lost to that.
    status = accounted(round=6)
    status.rendezvous.left_out = ["uid-w1"]
    lost = worker(1, "Failed", deleting=True, exit_code=137, disruption="NodeLost", finished_at=seconds(0.5))
    plan = step(status, 1.0, 6, old_process(), nodes=2, pods=[worker(0), lost, worker(2)])
    assert [r.reason for r in plan.status.last_failures] == ["NodeLost"]
    assert plan.status.goodput.open_incident is None
    # Without the take-out, the same pod's end is the fault.
    status.rendezvous.left_out = []
    plan = step(status, 1.0, 6, old_process(), nodes=2, pods=[worker(0), lost, worker(2)])
    assert plan.status.goodput.open_incident.kind == "NodeLost"


def test_a_round_the_same_nodes_formed_after_a_failure_is_not_a_rejoin():
    # torchrun restarted its workers in place; the store counted a failure round, which the operator books once
    # it read the agents' logs: that booking is the incident, not a Rejoin before it.
    status = accounted()
    store = StoreView(epoch="e1", round=6, complete=True, received_at=seconds(1.0), progress=old_process(),
                      participants=tuple(StoreNode(IP[i], 0.5) for i in range(3)), failure_rounds=1,
                      last_failure_round_at=seconds(0.9))
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    found = observed([worker(0), worker(1), worker(2), rdzv()], store=store, round_failures_wait=5.0)
    plan = planner.plan(job, found, seconds(1.0))
    assert plan.status.goodput.open_incident is None and plan.status.goodput.round == 6


def test_agents_re_forming_on_a_store_that_came_back_is_a_rejoin():
    ledger = step(accounted(), 1.0, 1, old_process(), epoch="e2").status.goodput
    assert (ledger.open_incident.kind, ledger.open_incident.reason) == ("Rejoin", "StoreReturned")
    assert (ledger.round, ledger.epoch) == (1, "e2")


def test_a_lost_store_the_training_stepped_through_ends_when_its_agents_re_form():
    status = accounted()
    status.goodput.open_incident = Incident(kind="StoreLost", reason="StoreLost", start_time="2026-01-01T11:59:58.000Z",
                                            detected_time="2026-01-01T11:59:58.500Z", epoch="e1", last_step=780)
    # The workers stepped on (800 at 0.4 s) while the store was away; the new store's first round completes.
    plan = step(status, 1.0, 1, old_process(), epoch="e2")
    ledger = plan.status.goodput
    closed = ledger.last_incidents[-1]
    assert (closed.kind, closed.lost_seconds) == ("StoreLost", 0.0)
    assert (ledger.open_incident.kind, ledger.open_incident.reason) == ("Rejoin", "StoreReturned")
    assert ledger.open_incident.start_time == "2026-01-01T12:00:00.400Z"


def test_a_rejoin_seen_after_the_new_process_reported_starts_just_before_it():
    # Rank 0's new process reported its start (no step yet) before the operator saw the round: the old one's last
    # step is gone with its report. The incident starts just before the new process began and closes at its first
    # step with what was seen (not at 0 s, as a training that stepped on).
    starting = ProgressView(pod="train-worker-0", started_at=seconds(0.5), step_seconds=0.1)
    plan = step(accounted(), 1.0, 6, starting)
    incident = plan.status.goodput.open_incident
    assert incident.kind == "Rejoin" and incident.start_time == "2026-01-01T12:00:00.499Z"
    plan = step(plan.status, 2.5, 6, new_process(0.5))
    closed = plan.status.goodput.last_incidents[-1]
    # From just before the new process began (0.499 s) to its checkpoint loaded (1.0 s); the step at the stop is
    # not known, so neither is the recompute.
    assert (closed.kind, closed.lost_seconds, closed.phases.recompute) == ("Rejoin", 0.501, None), closed


def test_a_rejoin_seen_after_the_new_process_loaded_and_stepped_closes_with_what_was_seen():
    # The warm start loads and steps within a second of the round: the operator, woken a little late, sees the
    # new process's report only. The incident starts just before that process began, not when it was seen.
    plan = step(accounted(), 3.0, 6, new_process(0.5))
    closed = plan.status.goodput.last_incidents[-1]
    assert closed.kind == "Rejoin" and closed.start_time == "2026-01-01T12:00:00.499Z"
    assert closed.lost_seconds == 0.501, closed


def test_a_rejoin_just_after_another_recovery_starts_at_the_last_step_of_the_process_it_restarts():
    # The process that recovery started (1.6 s before) stepped to 800 at 0.4 s; the newcomer's round completed at
    # 1.0 s (the store's clock, as is the report's): the report is that process's, whose restart is still to come.
    # Seen in a run on real nodes: the restarted rank 0's agent joined 4 s after the kill, and the Rejoin was
    # booked at 0 s from the process it was about to restart.
    recent = ProgressView(pod="train-worker-0", started_at=seconds(-1.6), step=800, step_at=seconds(0.4),
                          step_seconds=0.1, first_step=780, first_step_at=seconds(-1.0), received_at=seconds(0.4))
    status = accounted()
    store = StoreView(epoch="e1", round=6, complete=True, received_at=seconds(1.2), progress=recent,
                      round_completed_at=seconds(1.0), participants=tuple(StoreNode(IP[i], 0.5) for i in range(3)))
    job = factory.job(status.model_dump(by_alias=True, mode="json"), replicas=3)
    plan = planner.plan(job, observed([worker(0), worker(1), worker(2), rdzv()], store=store), seconds(1.2))
    incident = plan.status.goodput.open_incident
    assert incident is not None and incident.kind == "Rejoin", plan.status.goodput
    assert incident.start_time == "2026-01-01T12:00:00.400Z" and incident.last_step == 800
    plan = step(plan.status, 3.5, 6, new_process(1.5))
    closed = plan.status.goodput.last_incidents[-1]
    assert (closed.kind, closed.lost_seconds) == ("Rejoin", 2.6), closed


def lost_store() -> ElasticJobStatus:
    status = accounted()
    status.goodput.open_incident = Incident(kind="StoreLost", reason="StoreLost", start_time="2026-01-01T11:59:58.000Z",
                                            detected_time="2026-01-01T11:59:58.500Z", epoch="e1", last_step=780)
    return status


def test_a_lost_store_whose_agents_restarted_before_any_step_reached_the_new_one_costs_only_the_restart():
    # The agents found the store back at once and restarted the workers: the first report the new store holds is
    # the new process's (began at 0.5 s), and the steps the old one made meanwhile never reached a store. Seen on
    # real nodes: the loss was booked from the store's kill (3.2 s) for a 1.1 s restart.
    plan = step(lost_store(), 3.0, 1, new_process(0.5), epoch="e2")
    closed = {i.kind: i for i in plan.status.goodput.last_incidents}
    assert closed["StoreLost"].lost_seconds == 0.0
    assert (closed["Rejoin"].reason, closed["Rejoin"].start_time) == ("StoreReturned", "2026-01-01T12:00:00.499Z")
    assert closed["Rejoin"].lost_seconds == 0.501


def test_a_lost_store_whose_agents_left_with_it_costs_from_the_loss():
    # A torchrun without the kit exits with its store: its pods ended, and the training stopped at the loss.
    status = lost_store()
    status.last_failures = [FailureRecord(pod="train-worker-1", uid="u-1", reason="RendezvousLost", charged=False,
                                          time="2026-01-01T11:59:59Z")]
    plan = step(status, 3.0, 1, new_process(0.5), epoch="e2")
    closed = {i.kind: i for i in plan.status.goodput.last_incidents}
    assert "Rejoin" not in closed and closed["StoreLost"].lost_seconds >= 2.0, closed  # from the loss on


def test_a_lost_store_whose_agents_re_formed_before_any_report_reached_the_new_one_books_their_restart():
    # Seen on real nodes: the new store's first round completed (at 0.8 s, its clock) before any training report
    # reached it, and the loss was booked from the kill (3.5 s for a 1.4 s restart).
    store = StoreView(epoch="e2", round=1, complete=True, received_at=seconds(1.0), round_completed_at=seconds(0.8),
                      participants=tuple(StoreNode(IP[i], 0.5) for i in range(3)))
    job = factory.job(lost_store().model_dump(by_alias=True, mode="json"), replicas=3)
    plan = planner.plan(job, observed([worker(0), worker(1), worker(2), rdzv()], store=store), seconds(1.0))
    ledger = plan.status.goodput
    assert ledger.last_incidents[-1].kind == "StoreLost" and ledger.last_incidents[-1].lost_seconds == 0.0
    assert (ledger.open_incident.reason, ledger.open_incident.start_time) == ("StoreReturned",
                                                                              "2026-01-01T12:00:00.800Z")
    plan = step(plan.status, 3.0, 1, new_process(0.9), epoch="e2")
    closed = plan.status.goodput.last_incidents[-1]
    assert closed.kind == "Rejoin" and closed.lost_seconds == 0.6, closed  # to the checkpoint loaded at 1.4 s


def test_a_lost_store_whose_agents_resumed_their_round_on_the_new_one_costs_nothing_and_is_no_rejoin():
    # The agents wrote the running round back into the store that came back (elasticjob_warm/resume.py): the new
    # epoch holds round 5, the one accounted, and the training's process is the one from before the loss.
    status = lost_store()
    status.rendezvous.last_lost_time = "2026-01-01T11:59:58.000Z"
    plan = step(status, 1.0, 5, old_process(), epoch="e2")
    ledger = plan.status.goodput
    assert ledger.open_incident is None, ledger.open_incident
    assert [(i.kind, i.lost_seconds) for i in ledger.last_incidents] == [("StoreLost", 0.0)]
    assert (ledger.round, ledger.epoch) == (5, "e2")
    assert step(plan.status, 2.0, 5, old_process(1.9), epoch="e2").status.goodput.open_incident is None


def test_the_same_round_number_on_a_new_store_with_a_process_begun_since_the_loss_is_a_rejoin():
    # A first round (0) lost and formed afresh on the new store is round 0 again: the new process tells them apart.
    status = lost_store()
    status.goodput.round = status.rendezvous.round = 0
    status.rendezvous.last_lost_time = "2026-01-01T11:59:58.000Z"
    plan = step(status, 3.0, 0, new_process(0.5), epoch="e2")
    closed = {i.kind: i for i in plan.status.goodput.last_incidents}
    assert closed["StoreLost"].lost_seconds == 0.0 and closed["Rejoin"].reason == "StoreReturned", closed


def test_a_straggler_failing_after_the_training_finished_costs_nothing():
    # Training reached its end (worker-0's agent exited 0, so its workers succeeded); worker-2's agent, still
    # joining, found the rendezvous closed and exited 1. Seen in `make run`: booked WorkerLost, 1.5 s lost.
    done = worker(0, "Succeeded", exit_code=0, finished_at=seconds(0.5))
    straggler = worker(2, "Failed", exit_code=1, worker_exit_code=1, reason="Error", finished_at=seconds(0.8))
    plan = step(accounted(), 1.0, 5, old_process(), pods=[done, worker(1), straggler])
    assert [r.uid for r in plan.status.last_failures] == ["uid-w2"], plan.status.last_failures
    assert plan.status.goodput.open_incident is None and plan.status.goodput.incidents == 0
