"""Failures that are not the training's doing (planner/failures.py NOT_THE_TRAINING): a rank held after a planned
stop that nobody ended (StopExpired, elasticjob_progress's STOP_EXPIRED_EXIT) and a kit agent that its rendezvous
ended with no worker of it failed (RendezvousFailed, elasticjob_warm/rdzvexit.py). Read from the pod as the
kubelet reports it (observe.py), then through planner.plan: booked in status.lastFailures, a Warning Event and the
downtime ledger, never charged, no node avoided."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import NOW, failed, job, observed, rdzv, running_status, store, worker

import elasticjob_progress
from elasticjob import agent_messages, planner
from elasticjob.models import ElasticJobStatus, GoodputStatus
from elasticjob.observe import pod_view
from elasticjob_warm import rdzvexit

LINE = "elasticjob_warm.torchrun: the rendezvous ended this agent: RendezvousClosedError"
ROOT_CAUSE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_11:59:58
  host      : train-worker-0
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 18)
  error_file: <N/A>
============================================================"""


def ended(code: int, message: str) -> dict:
    return {"metadata": {"name": "train-worker-0", "uid": "uid-w0", "labels": {
                "elasticjob.dev/role": "worker", "elasticjob.dev/replica-index": "0"}},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "worker", "state": {"terminated": {
                "exitCode": code, "reason": "Error", "message": message,
                "finishedAt": "2026-01-01T11:59:59Z"}}}]}}


def test_the_operator_and_the_pods_programs_name_the_same_codes():
    assert agent_messages.RENDEZVOUS_EXIT == rdzvexit.RENDEZVOUS_EXIT
    assert agent_messages.STOP_EXPIRED_EXIT == elasticjob_progress.STOP_EXPIRED_EXIT
    assert LINE.startswith(rdzvexit.LINE)


@pytest.mark.parametrize("code, message, found", [
    (87, f"some output\n{LINE}\n", "RendezvousClosedError"),
    (1, f"{LINE}\n", None),  # the line without the agent's exit code: the workload's words
    (87, "sys.exit(87) from the script\n", None),  # the code without the line
    (87, f"{rdzvexit.LINE}Rendezvous Closed: 'x'\n", None),  # not a type's name: nothing quoted from the log
], ids=["line-and-code", "line-only", "code-only", "not-a-type"])
def test_an_agent_its_rendezvous_ended_is_read_from_its_exit_code_and_its_line(code, message, found):
    assert pod_view(ended(code, message)).rendezvous_failed == found


@pytest.mark.parametrize("code, message, expired", [
    (1, ROOT_CAUSE.format(code=85), True),  # torchrun gave up: its root cause is the held rank's code
    (1, ROOT_CAUSE.format(code=1), False),
    (85, "", True),  # the container's own code, no agent's verdict above it
], ids=["root-cause-85", "root-cause-1", "container-85"])
def test_a_hold_that_expired_is_read_from_the_workers_exit_code(code, message, expired):
    assert pod_view(ended(code, message)).stop_expired is expired


def two_workers(ended_pod) -> list:
    return [rdzv(), ended_pod, worker(1, node="node-b")]


@pytest.mark.parametrize("count_infrastructure", [False, True])
@pytest.mark.parametrize("pod, reason", [
    (failed(0, exit_code=87, rendezvous_failed="RendezvousClosedError"), "RendezvousFailed"),
    (failed(0, exit_code=87, rendezvous_failed="RendezvousConnectionError"), "RendezvousFailed"),
    (failed(0, exit_code=1, worker_exit_code=85, agent_gave_up=True), "StopExpired"),  # not MaxRestartsExceeded
], ids=["closed", "no-store", "stop-expired"])
def test_a_failed_pod_that_is_not_the_trainings_doing_is_booked_uncharged_and_no_node_avoided(
        pod, reason, count_infrastructure):
    result = planner.plan(job(running_status(), failurePolicy={
        "countInfrastructureFailures": count_infrastructure, "fatalExitCodes": [85, 87]}),
        observed(two_workers(pod)), NOW)
    record = result.status.last_failures[-1]
    assert (record.pod, record.reason, record.charged) == ("train-worker-0", reason, False)
    assert (result.status.restarts, result.status.phase, result.status.avoided_nodes) == (0, "Running", [])
    assert result.status.infrastructure_failures == 0
    warning, = [e for e in result.events if e.reason == reason]
    assert warning.type == "Warning" and "not the training's doing, not charged" in warning.message


def test_the_incident_is_in_the_downtime_ledger():
    status = ElasticJobStatus.model_validate(running_status(desiredReplicas=2))
    status.goodput = GoodputStatus(since=(NOW - timedelta(seconds=600)).strftime("%Y-%m-%dT%H:%M:%S.000Z"))
    pod = failed(0, exit_code=87, rendezvous_failed="RendezvousClosedError")
    result = planner.plan(job(status.model_dump(by_alias=True, mode="json")),
                          observed(two_workers(pod), store=store()), NOW)
    incident = result.status.goodput.open_incident
    assert (incident.reason, incident.pod) == ("RendezvousFailed", "train-worker-0")


def test_a_late_agent_meeting_the_round_closed_by_a_job_that_succeeded_is_booked_as_before():
    """The job's training finished (a worker exited 0, so its workers succeeded) and closed the rendezvous; an
    agent still joining met it. Booked as before this exit code: the pod's own reason, not charged."""
    late = failed(1, exit_code=87, rendezvous_failed="RendezvousClosedError")
    done = worker(0, "Succeeded", exit_code=0, finished_at=NOW - timedelta(seconds=2))
    result = planner.plan(job(running_status()), observed([rdzv(), done, late]), NOW)
    record = result.status.last_failures[-1]
    assert (record.pod, record.reason, record.charged) == ("train-worker-1", "Error", False)
    assert "training had already finished" in next(e.message for e in result.events if e.reason == "Error")


def logged(*codes: int) -> list[planner.RoundFailure]:
    return [planner.RoundFailure(pod=f"train-worker-{i}", exit_code=code, message=f"failed (exitcode: {code}) #{i}")
            for i, code in enumerate(codes)]


def pods() -> list:
    return [rdzv(), worker(0, node="node-a"), worker(1, node="node-b")]


@pytest.mark.parametrize("codes, reason, charged", [
    ((85, 85), "StopExpired", False),  # every held rank left with the code
    ((85, -15), "StopExpired", False),  # and its agent's SIGTERM to the other ranks of its pod
    ((85, 1), "Error", True),  # a training that failed besides: charged as ever
    ((1,), "Error", True),
], ids=["all-expired", "expired-and-sigterm", "expired-and-failed", "failed"])
def test_an_in_place_restart_after_holds_that_expired_is_booked_uncharged(codes, reason, charged):
    before = planner.plan(job(running_status()), observed(pods(), store=store()), NOW)
    result = planner.plan(job(before.status.model_dump(by_alias=True, mode="json")),
                          observed(pods(), store=store(failure_rounds=1), round_failures=logged(*codes)),
                          NOW + timedelta(seconds=1))
    record = result.status.last_failures[-1]
    assert (record.reason, record.charged, result.status.restarts) == (reason, charged, int(charged))
    if not charged:  # no node is blamed for it
        assert result.status.avoided_nodes == []
        assert any(e.type == "Warning" and e.reason == "StopExpired" for e in result.events)
