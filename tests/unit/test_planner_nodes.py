"""Nodes that stay bad (planner/nodes.py): a node where the job's workers failed, or where a pod of it was cut
off, is avoided by its next pods; the failures that follow there are one incident; a cut-off pod left running is
replaced once its kubelet reports it not Ready. Table tests through planner.plan, with the orderings the
controller can see: late, doubled and missing observations, and the status write lost between two plans."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from factory import NOW, job, observed, rdzv, running_status, store, worker

from elasticjob import builders, planner
from elasticjob.domain import Placement
from elasticjob.observe import ProgressView, StoreNode, StoreView

SICK = "node-a"


def again(result, **fields):
    return job(result.status.model_dump(by_alias=True, mode="json"), **fields)


def logged(pod: str = "train-worker-0", n: int = 1, code: int = 1) -> list[planner.RoundFailure]:
    return [planner.RoundFailure(pod=pod, exit_code=code, message=f"failed (exitcode: {code}) #{n}")]


def pods(sick_index: int = 0) -> list:
    """Two workers: the one of `sick_index` on the sick node, the other on a healthy one."""
    return [rdzv(), *(worker(i, node=SICK if i == sick_index else f"node-{i + 1}") for i in range(2))]


def deletes(result: planner.Plan) -> list[planner.DeletePod]:
    return [a for a in result.actions if isinstance(a, planner.DeletePod)]


def created(result: planner.Plan) -> list[dict]:
    return [a.manifest for a in result.actions if isinstance(a, planner.CreateObject)
            and a.manifest["kind"] == "Pod"]


def excluded(manifest: dict) -> list[list[str]]:
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    fields = [f for term in terms for f in term["matchFields"] if f["operator"] == "NotIn"]
    # The API server refuses a NotIn on a node's field with more than one value (seen on real nodes: the job
    # Failed with InvalidSpec when a second node was avoided).
    assert all(len(f["values"]) == 1 for f in fields), fields
    return [[v for f in term["matchFields"] if f["operator"] == "NotIn" for v in f["values"]] for term in terms]


def sick_rounds(answers: int, seconds_apart: float = 0.25, **spec):
    """A node whose every training process exits 1: torchrun restarts its workers in place, and the store's
    long-poll answers once per new round."""
    result = planner.plan(job(running_status(), **spec), observed(pods()), NOW)
    for n in range(1, answers + 1):
        result = planner.plan(again(result, **spec), observed(pods(), store=store(failure_rounds=n),
                                                              round_failures=logged(n=n)),
                              NOW + timedelta(seconds=n * seconds_apart))
    return result


# --- a sick node ------------------------------------------------------------------------------------------


def test_a_sick_node_costs_one_restart_however_often_its_workers_fail_and_its_pod_moves_off():
    """Measured before: 4 restarts charged within one second, and the job Failed at step 61 of 900."""
    result = sick_rounds(16)
    assert (result.status.restarts, result.status.phase) == (1, "Running")
    avoided, = result.status.avoided_nodes
    assert (avoided.node, avoided.reason, avoided.failures) == (SICK, "WorkerFailed", 16)
    assert not any(f.charged for f in result.status.last_failures[1:])  # the last 10 kept: all of the incident
    first = sick_rounds(1)
    assert [e.reason for e in first.events if e.reason == "NodeAvoided"] == ["NodeAvoided"]
    assert SICK in next(e.message for e in first.events if e.reason == "NodeAvoided")
    assert deletes(first) == [], "one failure moves nothing: an in-place restart may be all it needed"
    second = sick_rounds(2)
    stop, = deletes(second)
    assert (stop.name, stop.grace_seconds, stop.event.reason) == ("train-worker-0", 1, "MovedOffNode")


def test_the_pod_of_a_sick_node_comes_back_elsewhere():
    result = sick_rounds(2)
    # Its pod is gone: the replacement is made with the node excluded.
    back = planner.plan(again(result), observed([rdzv(), worker(1, node="node-2")], store=store(failure_rounds=2)),
                        NOW + timedelta(seconds=2))
    manifest, = created(back)
    assert manifest["metadata"]["name"] == "train-worker-0" and excluded(manifest) == [[SICK]]


def test_a_failed_pod_makes_its_node_avoided_and_the_next_failure_there_is_the_same_incident():
    failed = worker(0, "Failed", node=SICK, exit_code=1, worker_exit_code=1, reason="Error",
                    finished_at=NOW - timedelta(seconds=1))
    first = planner.plan(job(running_status()), observed([rdzv(), failed, worker(1, node="node-2")]), NOW)
    assert first.status.restarts == 1 and [n.node for n in first.status.avoided_nodes] == [SICK]
    # A second pod that was still on the node fails there 20 s later (past the incident window).
    later = worker(2, "Failed", node=SICK, uid="uid-w2", exit_code=1, worker_exit_code=1, reason="Error",
                   finished_at=NOW + timedelta(seconds=20))
    second = planner.plan(again(first, replicas=3), observed([rdzv(), worker(1, node="node-2"), later]),
                          NOW + timedelta(seconds=21))
    assert second.status.restarts == 1
    assert not second.status.last_failures[-1].charged
    assert any("avoided already" in e.message for e in second.events)


@pytest.mark.parametrize("reason, code, fatal, avoided", [
    ("Error", 1, [], True),
    ("OOMKilled", 137, [], False),  # the job's own memory limit: any node does the same
    ("Error", 3, [3], False),  # a fatal exit code fails the job; the node is not to blame
])
def test_which_failures_are_the_nodes(reason, code, fatal, avoided):
    failed = worker(0, "Failed", node=SICK, exit_code=code, worker_exit_code=code, reason=reason,
                    finished_at=NOW - timedelta(seconds=1))
    result = planner.plan(job(running_status(), failurePolicy={"fatalExitCodes": fatal}),
                          observed([rdzv(), failed, worker(1, node="node-2")]), NOW)
    assert [n.node for n in result.status.avoided_nodes] == ([SICK] if avoided else [])


def test_an_unconfirmed_round_blames_no_node():
    result = planner.plan(job(running_status()), observed(pods(), store=store(failure_rounds=1)), NOW)
    assert result.status.avoided_nodes == [] and result.status.last_failures[-1].reason == "Unconfirmed"


def test_avoid_node_seconds_zero_turns_it_off_and_lowering_it_ends_an_avoidance():
    off = sick_rounds(3, failurePolicy={"avoidNodeSeconds": 0})
    assert off.status.avoided_nodes == [] and off.status.restarts == 3
    on = sick_rounds(1)
    ended = planner.plan(again(on, failurePolicy={"avoidNodeSeconds": 0}), observed(pods(), store=store(
        failure_rounds=1)), NOW + timedelta(seconds=2))
    assert ended.status.avoided_nodes == [] and "NodeNoLongerAvoided" in [e.reason for e in ended.events]


def test_an_avoidance_ends_after_its_time_and_the_operator_wakes_for_it():
    on = sick_rounds(1)
    assert on.status.avoided_nodes[0].until == "2026-01-01T12:10:00Z"
    assert on.requeue_after <= 600
    still = planner.plan(again(on), observed(pods(), store=store(failure_rounds=1)), NOW + timedelta(seconds=599))
    assert [n.node for n in still.status.avoided_nodes] == [SICK]
    over = planner.plan(again(on), observed(pods(), store=store(failure_rounds=1)), NOW + timedelta(seconds=601))
    assert over.status.avoided_nodes == [] and "NodeNoLongerAvoided" in [e.reason for e in over.events]
    # A failure there now is a new incident, charged.
    fails = planner.plan(again(over), observed(pods(), store=store(failure_rounds=2), round_failures=logged(n=2)),
                         NOW + timedelta(seconds=602))
    assert fails.status.restarts == 2


def test_where_every_node_is_avoided_the_job_says_so_and_is_not_failed():
    stuck = worker(0, "Pending", node=None, started=False, unschedulable="0/3 nodes are available: 3 node(s) "
                   "didn't match Pod's node affinity/selector")
    on = sick_rounds(1)
    result = planner.plan(again(on), observed([rdzv(), stuck, worker(1, node="node-2")],
                                              store=store(failure_rounds=1)), NOW + timedelta(seconds=3))
    assert result.status.phase != "Failed"
    assert f"the job avoids node(s) {SICK} (WorkerFailed" in result.status.message


# --- orderings ----------------------------------------------------------------------------------------------


def test_each_observation_twice_books_nothing_twice():
    first = sick_rounds(1)
    twice = planner.plan(again(first), observed(pods(), store=store(failure_rounds=1), round_failures=logged(n=1)),
                         NOW + timedelta(seconds=0.5))
    assert twice.status.restarts == 1 and twice.status.avoided_nodes == first.status.avoided_nodes
    assert [e.reason for e in twice.events if e.reason in ("NodeAvoided", "WorkerFailed")] == []


def test_a_status_write_lost_between_two_plans_books_the_failure_once_when_replanned():
    """The operator killed between its status write and its next one: the next plan starts from the older status
    and sees the same store count, so it books the same failure again, once."""
    before = planner.plan(job(running_status()), observed(pods()), NOW)
    first = planner.plan(again(before), observed(pods(), store=store(failure_rounds=1), round_failures=logged()),
                         NOW + timedelta(seconds=1))
    replanned = planner.plan(again(before), observed(pods(), store=store(failure_rounds=1), round_failures=logged()),
                             NOW + timedelta(seconds=2))
    assert (replanned.status.restarts, [n.node for n in replanned.status.avoided_nodes]) == (1, [SICK])
    assert first.status.restarts == replanned.status.restarts


def test_a_round_seen_late_after_its_pod_left_blames_the_node_without_moving_anything():
    """The log names a pod already gone (its deletion seen before the store's answer): nothing to move, and no
    node to blame, since the pod is no longer observed."""
    gone = planner.plan(job(running_status()), observed([rdzv(), worker(1, node="node-2")],
                                                        store=store(failure_rounds=1), round_failures=logged()), NOW)
    assert gone.status.avoided_nodes == [] and deletes(gone) == []


# --- a pod cut off from the network -------------------------------------------------------------------------

IP = {i: f"10.244.0.{10 + i}" for i in range(3)}


def view(*nodes: StoreNode, round: int = 4, stalled: bool = False) -> StoreView:
    progress = ProgressView(pod="train-worker-0", step=100, stalled=stalled) if stalled else None
    return StoreView(epoch="e1", round=round, complete=True, participants=nodes, received_at=NOW, progress=progress)


def fresh(i: int) -> StoreNode:
    return StoreNode(IP[i], 0.3, False)


def silent(i: int, age: float = 6.0) -> StoreNode:
    return StoreNode(IP[i], age, True)


def three(ready1: bool = True) -> list:
    return [rdzv(), worker(0, node="node-1"), worker(1, node="node-2", ready=ready1), worker(2, node="node-3")]


def test_a_cut_off_pod_left_running_on_the_stores_word_is_replaced_once_its_kubelet_reports_it_not_ready():
    """Its agent is taken out at torch's own limit while its pod is Ready (the store's word alone: nothing is
    stopped), then the kit's readiness probe fails: the kubelet's word, on which the pod is replaced."""
    left = planner.plan(job(running_status(), replicas=3), observed(three(), store=view(
        fresh(0), silent(1), fresh(2))), NOW)
    assert left.status.rendezvous.left_out == ["uid-w1"] and deletes(left) == []
    assert left.status.ready_replicas == 2, "READY counts the workers in the round"
    # The survivors re-formed without it; its pod turns not Ready.
    later = NOW + timedelta(seconds=2)
    replaced = planner.plan(again(left, replicas=3), observed(three(ready1=False), store=view(
        fresh(0), fresh(2), round=5)), later)
    stop, = deletes(replaced)
    assert (stop.name, stop.grace_seconds, stop.event.reason) == ("train-worker-1", 0, "Partitioned")  # nodes.CUT_OFF_GRACE
    record = replaced.status.last_failures[-1]
    assert (record.reason, record.charged, replaced.status.restarts) == ("Partitioned", False, 0)
    assert [(n.node, n.reason) for n in replaced.status.avoided_nodes] == [("node-2", "Partitioned")]
    # Seen again before the pod is gone, or once it is deleting: nothing more.
    twice = planner.plan(again(replaced, replicas=3), observed(three(ready1=False), store=view(
        fresh(0), fresh(2), round=5)), later)
    assert deletes(twice) == [] and twice.status.infrastructure_failures == 1


def test_a_cut_off_pod_whose_kubelet_already_says_not_ready_is_fenced_and_its_node_avoided():
    result = planner.plan(job(running_status(), replicas=3), observed(three(ready1=False), store=view(
        fresh(0), silent(1, age=3.0), fresh(2))), NOW)
    stop, = deletes(result)
    assert (stop.name, stop.grace_seconds) == ("train-worker-1", 0)
    assert [n.node for n in result.status.avoided_nodes] == ["node-2"]


def test_a_left_out_pod_whose_network_healed_is_in_the_round_again_and_not_replaced():
    left = planner.plan(job(running_status(), replicas=3), observed(three(), store=view(
        fresh(0), silent(1), fresh(2))), NOW)
    healed = planner.plan(again(left, replicas=3), observed(three(), store=view(fresh(0), fresh(1), fresh(2),
                                                                                    round=6)), NOW)
    assert healed.status.rendezvous.left_out == [] and deletes(healed) == []
    assert healed.status.ready_replicas == 3


# --- placement ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template_affinity, expected", [
    (None, [[SICK, "node-b"]]),
    # A template's own required terms are alternatives: the exclusion holds in each.
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}},
     [[SICK, "node-b"], [SICK, "node-b"]]),
])
def test_avoided_nodes_are_excluded_by_name_in_every_required_term(template_affinity, expected):
    ref = job(running_status()).ref
    template = {"spec": {"containers": [{"name": "worker", "image": "img", "command": ["torchrun", "t.py"]}]}}
    if template_affinity:
        template["spec"]["affinity"] = template_affinity
    ref = dataclasses.replace(ref, spec=ref.spec.model_copy(update={"template": template}))
    pod = builders.worker_pod(ref, 0, "10.96.0.1:29400", placement=Placement(avoid_nodes=(SICK, "node-b")))
    assert excluded(pod) == expected
    if template_affinity:
        kept = [t["matchExpressions"][0]["values"] for t in pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
        assert kept == [["a100"], ["h100"]]


# --- the kit's node check (elasticjob_warm/nodecheck.py) ----------------------------------------------------


def ended(code: int, message: str) -> dict:
    return {"metadata": {"name": "train-worker-0", "uid": "uid-w0", "labels": {
                "elasticjob.dev/role": "worker", "elasticjob.dev/replica-index": "0"}},
            "spec": {"nodeName": SICK},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "worker", "state": {"terminated": {
                "exitCode": code, "reason": "Error", "message": message,
                "finishedAt": "2026-01-01T11:59:59Z"}}}]}}


LINE = "elasticjob_warm.torchrun: node check failed: matmul on cuda:1 gave a wrong result: 12 of 65536 differ"


@pytest.mark.parametrize("code, message, found", [
    (86, f"some output\n{LINE}\n", "matmul on cuda:1 gave a wrong result: 12 of 65536 differ"),
    (1, f"{LINE}\n", None),  # the line without the check's exit code: the workload's words
    (86, "exit(86) from the script\n", None),  # the code without the line
])
def test_a_failed_node_check_is_read_from_the_agents_exit_code_and_its_line(code, message, found):
    from elasticjob.observe import pod_view

    assert pod_view(ended(code, message)).node_check_failed == found


@pytest.mark.parametrize("count_infrastructure, charged", [(False, False), (True, True)])
def test_a_node_that_fails_its_check_is_avoided_and_costs_no_restart(count_infrastructure, charged):
    from elasticjob.observe import pod_view

    pod = dataclasses.replace(pod_view(ended(86, LINE)), owner_uid=job(running_status()).ref.uid)
    result = planner.plan(job(running_status(), failurePolicy={"countInfrastructureFailures": count_infrastructure}),
                          observed([rdzv(), pod, worker(1, node="node-2")]), NOW)
    record = result.status.last_failures[-1]
    assert (record.reason, record.charged, result.status.restarts) == ("NodeCheckFailed", charged, int(charged))
    assert [(n.node, n.reason) for n in result.status.avoided_nodes] == [(SICK, "NodeCheckFailed")]
    assert result.status.infrastructure_failures == int(not charged)
    assert "cuda:1" in result.status.avoided_nodes[0].message


@pytest.mark.parametrize("served_for, fenced", [(3, False), (11, True)])
def test_a_pod_still_unready_from_a_lost_store_is_no_cut_off_pod_while_the_new_store_settles(served_for, fenced):
    """Through the kit every worker is unready while its store's address answers nothing (a store pod gone before
    its endpoint); right after the new store serves, an agent slow to reconnect, its pod still unready, is not
    cut off: its readiness is no evidence for STORE_SETTLE (10 s)."""
    back = (NOW - timedelta(seconds=served_for)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = running_status(conditions=[{"type": "RendezvousReady", "status": "True", "reason": "StoreReady",
                                         "lastTransitionTime": back}])
    result = planner.plan(job(status, replicas=3), observed(three(ready1=False), store=view(
        fresh(0), silent(1, age=3.0), fresh(2))), NOW)
    assert [d.name for d in deletes(result)] == (["train-worker-1"] if fenced else [])


def test_the_first_round_whose_failure_every_pod_logged_blames_no_node_and_the_next_finds_it_in_one_incident():
    """Seen on real nodes: rank 0's node turned sick, its worker died mid-step, the healthy peer's collective
    broke and its agent logged exit 1 first; the healthy node was avoided. Every round after that, the sick node's
    worker fails at its start, alone."""
    both = [planner.RoundFailure(pod="train-worker-1", exit_code=1, message="healthy peer: failed (exitcode: 1)"),
            planner.RoundFailure(pod="train-worker-0", exit_code=1, message="sick: failed (exitcode: 1)")]
    start = planner.plan(job(running_status()), observed(pods()), NOW)
    first = planner.plan(again(start), observed(pods(), store=store(failure_rounds=1), round_failures=both),
                         NOW + timedelta(seconds=1))
    assert first.status.restarts == 1 and first.status.avoided_nodes == []
    second = planner.plan(again(first), observed(pods(), store=store(failure_rounds=2), round_failures=logged(n=2)),
                          NOW + timedelta(seconds=3))
    assert second.status.restarts == 1, "the node found one round later is the same incident"
    assert [n.node for n in second.status.avoided_nodes] == [SICK]
    assert "the same incident" in second.status.last_failures[-1].message
    third = planner.plan(again(second), observed(pods(), store=store(failure_rounds=3), round_failures=logged(n=3)),
                         NOW + timedelta(seconds=4))
    assert third.status.restarts == 1 and [d.name for d in deletes(third)] == ["train-worker-0"]


@pytest.mark.parametrize("code", [-9, -15])
def test_an_in_place_kill_blames_no_node(code):
    """SIGKILL in place is the kernel's OOM killer as often as not (the job's memory); SIGTERM is the agent's own."""
    result = planner.plan(job(running_status()), observed(pods(), store=store(failure_rounds=1),
                                                          round_failures=logged(code=code)), NOW)
    assert result.status.avoided_nodes == []


def test_a_pod_left_out_while_the_store_settles_is_replaced_once_it_has_without_another_event():
    """Seen on real nodes: a pod cut off 4 s after the job's store first served was left out (the store's word)
    and turned not Ready; no event came after the settling time, and it was never replaced."""
    back = (NOW - timedelta(seconds=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = running_status(conditions=[{"type": "RendezvousReady", "status": "True", "reason": "StoreReady",
                                         "lastTransitionTime": back}])
    left = planner.plan(job(status, replicas=3), observed(three(), store=view(fresh(0), silent(1), fresh(2))), NOW)
    assert left.status.rendezvous.left_out == ["uid-w1"]
    unready = planner.plan(again(left, replicas=3), observed(three(ready1=False), store=view(
        fresh(0), fresh(2), round=5)), NOW + timedelta(seconds=1))
    assert deletes(unready) == [] and unready.status.rendezvous.left_out == ["uid-w1"]
    assert unready.requeue_after <= 5.0 + 0.01, "looks again when the store has served 10 s"
    later = planner.plan(again(unready, replicas=3), observed(three(ready1=False), store=view(
        fresh(0), fresh(2), round=5)), NOW + timedelta(seconds=1 + unready.requeue_after))
    assert [d.name for d in deletes(later)] == ["train-worker-1"]
