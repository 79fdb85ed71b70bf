"""The queue label is never bypassed: where Kueue is off or absent a labelled job holds and says why; a job
whose Workload exists keeps its gate when the label is removed."""

from __future__ import annotations

import pytest
from factory import NOW, SERVICE, creates, deletes, job, observed, rdzv, running_status, with_kueue, worker
from test_planner_queueing import ADMITTED, FLAVORS, PENDING, admission, workload

from elasticjob import planner
from elasticjob.kueue import names as kueue_names
from elasticjob.kueue.status import admission as kueue_admission
from elasticjob.models import Phase

QUEUED = {kueue_names.QUEUE_LABEL: "lq"}
ABSENT, OFF = with_kueue(on=False, mode="auto"), with_kueue(on=False, mode="off")




@pytest.mark.parametrize("settings, reason, words", [
    (ABSENT, "KueueAbsent", "install Kueue"),
    (OFF, "KueueOff", "kueue.mode: auto"),
])
def test_a_labelled_job_without_kueue_does_not_start_and_says_why(settings, reason, words):
    result = planner.plan(job(labels=QUEUED), observed([rdzv()], SERVICE), NOW, settings)
    assert creates(result) == []
    assert result.status.phase == Phase.QUEUED and result.status.reason == reason
    admitted = next(c for c in result.status.conditions if c.type == "Admitted")
    assert admitted.status == "False" and admitted.reason == reason
    assert "Kueue" in admitted.message and words in admitted.message and "remove the label" in admitted.message
    warnings = [e for e in result.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == [reason] and "Kueue" in warnings[0].message


def test_a_running_labelled_job_stops_when_kueue_goes():
    pods = [rdzv(), worker(0, phase="Running"), worker(1, phase="Running")]
    result = planner.plan(job(running_status(), labels=QUEUED), observed(pods, SERVICE), NOW, ABSENT)
    assert [name for name, _ in deletes(result)] == ["train-worker-0", "train-worker-1"]  # the store last
    assert result.status.reason == "KueueAbsent"


def test_the_warning_is_posted_once():
    first = planner.plan(job(labels=QUEUED), observed([rdzv()], SERVICE), NOW, ABSENT)
    again = planner.plan(job(first.status.model_dump(by_alias=True, exclude_none=True), labels=QUEUED),
                         observed([rdzv()], SERVICE), NOW, ABSENT)
    assert not [e for e in again.events if e.type == "Warning"]


# --- the label removed from a job whose Workload exists ------------------------------------------------------


def test_an_admitted_job_whose_label_is_removed_stays_at_its_admitted_count():
    j = job(running_status(), minReplicas=1, maxReplicas=4, replicas=4)  # no queue label any more
    seen = observed([rdzv(), worker(0), worker(1)], SERVICE, flavors=FLAVORS,
                    workload=workload(ADMITTED, admission(2), workers=(2, 1)))
    result = planner.plan(j, seen, NOW, with_kueue(on=True))
    assert creates(result) == []
    assert kueue_admission(result.status).state == "Admitted" and result.status.desired_replicas == 2


def test_a_pending_workload_keeps_an_unlabelled_job_queued():
    j = job(running_status(), runPolicy={"suspend": True})
    result = planner.plan(j, observed([], SERVICE, workload=workload(PENDING)), NOW, with_kueue(on=True))
    assert creates(result) == [] and result.status.phase == Phase.QUEUED


# --- a queue required (--require-queue-name) ------------------------------------------------------------------

REQUIRED = with_kueue(on=True, require_queue_name=True)


@pytest.mark.parametrize("settings, labels, held", [
    (REQUIRED, {}, True),  # no label: held, whatever runs
    (with_kueue(on=False, require_queue_name=True), {}, True),  # Kueue absent: still never unqueued
    (with_kueue(on=True), {}, False),  # not required: runs as any job
    (REQUIRED, QUEUED, False),  # labelled: queued in Kueue (suspended first)
])
def test_a_job_without_a_queue_is_held_where_one_is_required(settings, labels, held):
    pods = [rdzv(), worker(0, phase="Running"), worker(1, phase="Running")]
    result = planner.plan(job(running_status(), labels=labels), observed(pods, SERVICE), NOW, settings)
    assert (result.status.reason == "QueueNameRequired") == held
    if held:
        assert creates(result) == [] and [n for n, _ in deletes(result)] == [p.name for p in pods[1:]]  # store last
        assert result.status.phase == Phase.QUEUED and kueue_admission(result.status) is None
        admitted = next(c for c in result.status.conditions if c.type == "Admitted")
        assert admitted.status == "False" and kueue_names.QUEUE_LABEL in admitted.message
        assert [e.reason for e in result.events if e.type == "Warning"] == ["QueueNameRequired"]


def test_a_job_whose_label_was_removed_keeps_its_workloads_gate_where_a_queue_is_required():
    j = job(running_status(), minReplicas=1, maxReplicas=4, replicas=4)
    seen = observed([rdzv(), worker(0), worker(1)], SERVICE, flavors=FLAVORS,
                    workload=workload(ADMITTED, admission(2), workers=(2, 1)))
    result = planner.plan(j, seen, NOW, with_kueue(on=True, require_queue_name=True))
    assert kueue_admission(result.status).state == "Admitted" and deletes(result) == []
