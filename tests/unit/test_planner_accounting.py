"""Counting under real orderings: failures seen again and again, restarts torchrun made in place, refusals,
and a job that finished while some of its pods never started."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import NOW, condition, creates, deletes, failed, job, observed, rdzv, running_status, store, worker

from elasticjob import planner
from elasticjob.models import MAX_FAILURES_KEPT

# An agent's exit line, read from its pod's log since the last read: the operator's evidence of an in-place restart.
LOGGED = [planner.RoundFailure(pod="train-worker-0", exit_code=1, message="failed (exitcode: 1)")]


def plan(j, pods, **seen):
    return planner.plan(j, observed(pods, **seen), NOW)


def again(result, **fields):
    """The same job, with the status the last plan wrote."""
    return job(result.status.model_dump(by_alias=True, mode="json"), **fields)


def evicted(index: int):
    return worker(index, deleting=True, deletion_time=NOW - timedelta(seconds=3), disruption="Evicted",
                  uid=f"evicted-{index}")


# --- each failure once, however long its pod lingers -----------------------------------------------------


def test_a_drain_of_many_slow_pods_counts_each_eviction_once():
    older = [{"pod": f"old-{i}", "uid": f"old-{i}", "reason": "Error"} for i in range(MAX_FAILURES_KEPT)]
    pods = [rdzv()] + [evicted(i) for i in range(15)]
    first = plan(job(running_status(lastFailures=older), replicas=15), pods)
    assert first.status.infrastructure_failures == 15
    assert sum(e.reason == "Evicted" for e in first.events) == 15
    # The pods take their time to go: every later reconcile sees them again, the display list long rolled over.
    second = plan(again(first, replicas=15), pods)
    third = plan(again(second, replicas=15), pods)
    assert third.status.infrastructure_failures == 15 and second.events == [] and third.events == []
    assert len(third.status.last_failures) == MAX_FAILURES_KEPT
    # Once the pods are gone they are forgotten: what is remembered stays bounded.
    gone = plan(again(third, replicas=15), [rdzv()])
    assert gone.status.counted_failures == [] and gone.status.infrastructure_failures == 15


def test_a_failure_counted_before_an_operator_restart_is_not_counted_again():
    first = plan(job(running_status()), [rdzv(), worker(0), failed(1, exit_code=1)])
    assert first.status.restarts == 1 and deletes(first) == [("train-worker-1", 0)]
    # The operator died after writing status, before the delete: the new one sees the same failed pod.
    after = plan(again(first), [rdzv(), worker(0), failed(1, exit_code=1)])
    assert after.status.restarts == 1 and after.events == []
    assert deletes(after) == [("train-worker-1", 0)]


# --- restarts torchrun made in place, as the store reports them ------------------------------------------


def test_an_in_place_restart_is_charged_once_with_its_cause():
    cause = [planner.RoundFailure(pod="train-worker-1", exit_code=3, message="failed (exitcode: 3)")]
    pods = [rdzv(), worker(0), worker(1)]
    first = plan(job(running_status()), pods, store=store(failure_rounds=1), round_failures=cause)
    assert first.status.restarts == 1 and first.status.phase == "Running"
    assert first.status.rendezvous.epoch == "e1" and first.status.rendezvous.failure_rounds == 1
    record = first.status.last_failures[-1]
    assert (record.pod, record.exit_code, record.charged) == ("train-worker-1", 3, True)
    # The store already saw the group re-formed: the ledger's incident closes with it (planner/ledger.py). The
    # node it failed on is avoided by the job's next pods (planner/nodes.py).
    assert [e.reason for e in first.events] == ["WorkerFailed", "NodeAvoided", "IncidentClosed"]
    steady = plan(again(first), pods, store=store(failure_rounds=1), round_failures=cause)
    assert steady.status.restarts == 1 and steady.events == []


def test_a_worker_killed_by_a_signal_is_the_cause_not_the_peer_whose_collective_then_failed():
    cause = [planner.RoundFailure(pod="train-worker-0", exit_code=1, message="failed (exitcode: 1)"),
             planner.RoundFailure(pod="train-worker-1", exit_code=-15, message="failed (exitcode: -15)"),
             planner.RoundFailure(pod="train-worker-1", exit_code=-9, message="failed (exitcode: -9)")]
    result = plan(job(running_status()), [rdzv(), worker(0), worker(1)], store=store(failure_rounds=1),
                  round_failures=cause)
    record = result.status.last_failures[-1]
    assert (record.pod, record.exit_code, result.status.restarts) == ("train-worker-1", -9, 1)


def test_a_new_store_counts_from_zero_and_its_past_is_not_charged_twice():
    status = running_status(restarts=1, rendezvous={"ready": True, "epoch": "e1", "failureRounds": 1})
    result = plan(job(status), [rdzv(), worker(0), worker(1)], store=store(epoch="e2", failure_rounds=0))
    assert result.status.restarts == 1 and result.status.rendezvous.epoch == "e2"


@pytest.mark.parametrize("rounds, max_restarts, phase", [(2, 3, "Running"), (4, 3, "Failed")])
def test_a_worker_failing_at_every_start_uses_up_the_budget(rounds, max_restarts, phase):
    # On every node it lands on (a script that fails wherever it runs): each node's first failure is charged.
    result = plan(job(running_status(), maxRestarts=max_restarts), [rdzv(), worker(0), worker(1)])
    for answer in range(1, rounds + 1):  # the store answers the operator's long-poll at each round
        logged = [planner.RoundFailure(pod="train-worker-1", exit_code=1, message=f"failed (exitcode: 1) #{answer}")]
        pods = [rdzv(), worker(0), worker(1, node=f"node-{answer}", uid=f"uid-w1-{answer}")]
        result = planner.plan(again(result, maxRestarts=max_restarts),
                              observed(pods, store=store(failure_rounds=answer), round_failures=logged),
                              NOW + timedelta(seconds=5 * answer))
    assert result.status.restarts == rounds and result.status.phase == phase
    if phase == "Failed":
        assert result.status.reason == "MaxRestartsExceeded"
        # The group is stopped: the operator alone enforces the budget, agents never give up by themselves.
        assert ("train-worker-0", None) in deletes(result) and ("train-rdzv", None) in deletes(result)


def test_one_answer_is_charged_one_round_whatever_it_reports():
    result = plan(job(running_status()), [rdzv(), worker(0), worker(1)], store=store(failure_rounds=1_000_000),
                  round_failures=LOGGED)
    assert result.status.restarts == 1 and result.status.phase == "Running"
    assert "reported 1000000 new rounds at once, 1 charged" in result.status.last_failures[-1].message
    steady = planner.plan(again(result), observed([rdzv(), worker(0), worker(1)],
                                                  store=store(failure_rounds=1_000_000), round_failures=LOGGED),
                          NOW + timedelta(seconds=5))
    assert steady.status.restarts == 1


def test_quick_successive_in_place_restarts_are_each_charged_where_no_node_is_avoided():
    off = {"failurePolicy": {"avoidNodeSeconds": 0}}
    first = plan(job(running_status(), **off), [rdzv(), worker(0)], store=store(failure_rounds=1, nodes=1),
                 round_failures=LOGGED)
    later = planner.plan(again(first, **off), observed([rdzv(), worker(0)], store=store(failure_rounds=2, nodes=1),
                                                       round_failures=LOGGED), NOW + timedelta(seconds=5))
    assert later.status.restarts == 2 and later.status.avoided_nodes == []


def test_a_fatal_exit_code_seen_in_the_agents_logs_fails_the_job_at_once():
    cause = [planner.RoundFailure(pod="train-worker-0", exit_code=1),
             planner.RoundFailure(pod="train-worker-1", exit_code=42)]
    result = plan(job(running_status(), failurePolicy={"fatalExitCodes": [42]}), [rdzv(), worker(0), worker(1)],
                  store=store(failure_rounds=1), round_failures=cause)
    assert (result.status.phase, result.status.reason) == ("Failed", "FatalExitCode")
    assert "train-worker-1" in result.status.message and "42 is in failurePolicy" in result.status.message


def test_membership_changes_reported_by_the_store_cost_nothing():
    # Scale-down, a lost node, a join: the rounds advance but the store counts no failure round.
    result = plan(job(running_status(), maxRestarts=0), [rdzv(), worker(0)], store=store(round=9, nodes=1))
    assert result.status.restarts == 0 and result.status.phase == "Running"


# --- finished while some pods never started --------------------------------------------------------------


def test_a_worker_that_never_started_does_not_hold_up_success():
    never = worker(1, "Pending", node=None, unschedulable="0/3 nodes are available", started=False)
    result = plan(job(running_status(), runPolicy={"activeDeadlineSeconds": 7200}),
                  [rdzv(), worker(0, "Succeeded"), never])
    assert result.status.phase == "Succeeded"
    assert ("train-worker-1", None) in deletes(result)


def test_a_worker_that_started_is_waited_for():
    starting = worker(1, "Pending", started=True)  # containers ran once: it holds a rank
    result = plan(job(running_status()), [rdzv(), worker(0, "Succeeded"), starting])
    assert (result.status.phase, result.status.reason) == ("Running", "Completing")
    assert deletes(result) == []


# --- refusals by the API server ---------------------------------------------------------------------------


def test_a_refusal_is_shown_and_nothing_is_created_until_the_retry_time():
    said = 'pods "train-worker-1" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=1'
    waiting = plan(job(running_status()), [rdzv(), worker(0)], refused=said, retry_at=NOW + timedelta(seconds=8))
    assert creates(waiting) == []
    assert condition(waiting, "ReplicaFailure") == "True" and said in waiting.status.message
    assert waiting.requeue_after <= 8
    retry = plan(again(waiting), [rdzv(), worker(0)], refused=said, retry_at=NOW - timedelta(seconds=1))
    assert creates(retry) == ["train-worker-1"]
    cleared = plan(again(retry), [rdzv(), worker(0), worker(1)])
    assert condition(cleared, "ReplicaFailure") == "False"


def test_a_job_never_refused_has_no_replica_failure_condition():
    assert condition(plan(job(running_status()), [rdzv(), worker(0), worker(1)]), "ReplicaFailure") is None


@pytest.mark.parametrize("lost, restarts", [(failed(1, exit_code=137, reason="Error", ago=8), 1), (evicted(1), 0)])
def test_a_round_re_formed_by_a_replacement_with_its_predecessors_address_is_not_charged_again(lost, restarts):
    # The replacement of a killed (or evicted) pod can come back with the same address: the store then sees
    # the same nodes re-form the round and reports a failure round. It is the incident already counted.
    first = plan(job(running_status()), [rdzv(), worker(0), lost])
    assert first.status.restarts == restarts
    replaced = plan(again(first), [rdzv(), worker(0), worker(1, uid="new-1")],
                    store=store(failure_rounds=1, last_failure_round_at=NOW))
    assert replaced.status.restarts == restarts
    assert not replaced.status.last_failures[-1].charged
    assert "WorkerFailed" not in [e.reason for e in replaced.events]
    # A worker failing afterwards (on a node not avoided) is a restart of its own.
    later = planner.plan(again(replaced), observed([rdzv(), worker(0, node="node-b"), worker(1, uid="new-1")],
                                                   store=store(failure_rounds=2, last_failure_round_at=NOW),
                                                   round_failures=LOGGED), NOW + timedelta(seconds=5))
    assert later.status.restarts == restarts + 1
