"""A node that stays bad, tainted for every pod (--taint-bad-nodes, planner/nodes.py taint): when the planner asks
for the taint and for its removal, and that it never does without the setting. Table tests of the plan's
actions; what the controller makes of them on the node is test_node_taints.py's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import NOW, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.domain import Settings
from elasticjob.planner import nodes, stragglers
from elasticjob.planner.base import stamp

ON, OFF = Settings(taint_bad_nodes=True), Settings()
SICK = "node-a"


def avoiding(*entries: tuple[str, str, int], **spec) -> planner.Job:
    """A running job that avoids each (node, reason, seconds ago) since then, for the spec's 600 s."""
    return job(running_status(avoidedNodes=[
        {"node": node, "reason": reason, "message": "m", "since": stamp(NOW - timedelta(seconds=ago)),
         "until": stamp(NOW - timedelta(seconds=ago) + timedelta(seconds=600))} for node, reason, ago in entries]),
        **spec)


def taint_actions(result: planner.Plan) -> list[planner.TaintNode | planner.UntaintNode]:
    return [a for a in result.actions if isinstance(a, (planner.TaintNode, planner.UntaintNode))]


def planned(before: planner.Job, settings: Settings, now=NOW, pods=None) -> planner.Plan:
    """A plan and its taints, as lifecycle.plan asks for them after the job's other steps."""
    result = planner.plan(before, observed(pods or [rdzv(), worker(0, node="node-1"), worker(1, node="node-2")]),
                          now, settings)
    result.actions = [a for a in result.actions if not isinstance(a, (planner.TaintNode, planner.UntaintNode))]
    nodes.taint(result, before, settings, now)
    return result


def failed_there() -> list:
    return [rdzv(), worker(0, "Failed", node=SICK, exit_code=1, worker_exit_code=1, reason="Error",
                           finished_at=NOW - timedelta(seconds=1)), worker(1, node="node-2")]


def test_a_node_the_job_starts_avoiding_is_tainted_until_its_avoidance_ends():
    result = planned(job(running_status()), ON, pods=failed_there())
    (entry,) = result.status.avoided_nodes
    (taint,) = taint_actions(result)
    assert taint == planner.TaintNode(SICK, "WorkerFailed", entry.until, event=taint.event)
    assert entry.until == stamp(NOW - timedelta(seconds=1) + timedelta(seconds=600))
    assert taint.event.reason == "NodeTainted" and SICK in taint.event.message


def test_without_the_setting_nothing_is_tainted_or_untainted():
    assert taint_actions(planned(job(running_status()), OFF, pods=failed_there())) == []
    assert taint_actions(planned(avoiding((SICK, "WorkerFailed", 10)), OFF)) == []
    assert taint_actions(planned(avoiding((SICK, "WorkerFailed", 700)), OFF)) == []  # its avoidance ends here
    # Through the planner itself: the default settings never taint.
    assert taint_actions(planner.plan(job(running_status()), observed(failed_there()), NOW)) == []


@pytest.mark.parametrize("reason, tainted", [
    ("WorkerFailed", True),
    ("NodeCheckFailed", True),
    ("Partitioned", True),
    (stragglers.SLOW_NODE, True),
    ("SomethingElse", False),  # a reason that is not the node's own (none yet): the job's avoidance alone
])
def test_which_reasons_taint(reason, tainted):
    result = planned(avoiding((SICK, reason, 10)), ON)
    assert [(a.node, a.reason) for a in taint_actions(result)] == ([(SICK, reason)] if tainted else [])


def test_every_avoided_node_is_asked_for_at_every_plan_the_controller_sends_only_what_changed():
    """Level-based: the planner cannot see the node, and an action lost to an error comes back."""
    result = planned(avoiding((SICK, "WorkerFailed", 10), ("node-b", "Partitioned", 20)), ON)
    assert sorted((a.node, a.reason, a.until) for a in taint_actions(result)) == [
        (SICK, "WorkerFailed", stamp(NOW + timedelta(seconds=590))),
        ("node-b", "Partitioned", stamp(NOW + timedelta(seconds=580)))]


def test_a_raised_avoid_node_seconds_moves_the_end_later():
    result = planned(avoiding((SICK, "WorkerFailed", 10), failurePolicy={"avoidNodeSeconds": 3600}), ON)
    (taint,) = taint_actions(result)
    assert taint.until == stamp(NOW + timedelta(seconds=3590))


def test_an_avoidance_that_ends_asks_for_the_taint_to_go():
    result = planned(avoiding((SICK, "WorkerFailed", 600), ("node-b", "WorkerFailed", 10)), ON)
    assert [e.node for e in result.status.avoided_nodes] == ["node-b"]
    untaint, taint = sorted(taint_actions(result), key=lambda a: type(a).__name__, reverse=True)
    assert untaint == planner.UntaintNode(SICK, event=untaint.event) and untaint.event.reason == "NodeUntainted"
    assert (taint.node, type(taint)) == ("node-b", planner.TaintNode)


def test_lowering_avoid_node_seconds_ends_the_avoidance_and_asks_for_the_taint_to_go():
    result = planned(avoiding((SICK, "WorkerFailed", 10), failurePolicy={"avoidNodeSeconds": 0}), ON)
    assert [(type(a), a.node) for a in taint_actions(result)] == [(planner.UntaintNode, SICK)]


def test_an_ended_avoidance_for_another_reason_is_not_untainted():
    result = planned(avoiding((SICK, "SomethingElse", 600)), ON)
    assert result.status.avoided_nodes == [] and taint_actions(result) == []


def test_an_avoidance_whose_time_is_past_but_still_listed_is_not_tainted():
    """A finished job keeps its avoided nodes in status (its avoidances are no longer expired): nothing to taint."""
    finished = job({**running_status(), "phase": "Failed", "reason": "BackoffLimitExceeded", "avoidedNodes": [
        {"node": SICK, "reason": "WorkerFailed", "message": "m", "since": stamp(NOW - timedelta(seconds=700)),
         "until": stamp(NOW - timedelta(seconds=100))}]})
    result = planner.plan(finished, observed([rdzv()]), NOW, ON)
    result.actions = []
    nodes.taint(result, finished, ON, NOW)
    assert [e.node for e in result.status.avoided_nodes] == [SICK] and taint_actions(result) == []


def test_the_planner_asks_for_taints_itself_with_the_setting():
    """lifecycle.plan calls nodes.taint: through the planner alone, with the setting, the node is tainted."""
    result = planner.plan(job(running_status()), observed(failed_there()), NOW, ON)
    assert [(type(a), a.node) for a in taint_actions(result)] == [(planner.TaintNode, SICK)]


def test_the_sick_reasons_are_valid_label_values():
    """The taint's value is the reason: a label value (63 characters at most, alphanumeric and -_.)."""
    import re
    assert stragglers.SLOW_NODE in nodes.SICK
    assert all(re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", r) for r in nodes.SICK)
