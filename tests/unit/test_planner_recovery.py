"""The operator nudges the rendezvous it hosts only on evidence: table tests of what it asks the store."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from factory import NOW, SERVICE, job, observed, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.observe import ProgressView, StoreNode, StoreView
from elasticjob_store import protocol

IP = {i: f"10.244.0.{10 + i}" for i in range(4)}


def view(*nodes, complete=True, round=4, waiting=(), received=NOW) -> StoreView:
    return StoreView(epoch="e1", round=round, complete=complete, participants=tuple(nodes),
                     waiting=tuple(waiting), received_at=received)


def node(i: int, age: float = 0.5, stale: bool | None = None) -> StoreNode:
    return StoreNode(IP[i], age, age > 2.5 if stale is None else stale)


def requests(result: planner.Plan) -> list[protocol.Request]:
    return [a.request for a in result.actions if isinstance(a, planner.StoreAction)]


def nudges(result: planner.Plan) -> list[tuple[str, dict]]:
    """As the store reads them: (kind, body)."""
    return [(r.KIND, r.to_wire()) for r in requests(result)]


def plan(pods, store, now=NOW, **fields):
    return planner.plan(job(running_status(), **fields), observed([rdzv()] + pods, store=store), now)


def killed(i: int, ago: float = 0.5):
    return worker(i, "Failed", exit_code=137, finished_at=NOW - timedelta(seconds=ago))


def test_a_killed_pods_agent_is_removed_with_its_termination_as_the_fence():
    result = plan([worker(0), killed(1), worker(2)], view(node(0), node(1), node(2)), replicas=3)
    removed, = [r for r in requests(result) if isinstance(r, protocol.Remove)]
    assert removed == protocol.Remove(IP[1], (NOW - timedelta(seconds=0.5)).timestamp())
    event = next(a.event for a in result.actions if isinstance(a, planner.StoreAction))
    assert "train-worker-1 terminated" in event.message


def test_a_running_pod_is_never_removed_however_late_its_heartbeat():
    # Under CPU load a heartbeat can be late; with the pod running and ready that is no evidence.
    result = plan([worker(0), worker(1)], view(node(0), node(1, age=4.0)))
    assert nudges(result) == []
    assert result.requeue_after <= 2.0 + 0.01, "looks again when torch's own limit (6 s) is reached"


def test_an_address_no_pod_has_is_removed_only_once_its_heartbeat_is_stale():
    assert nudges(plan([worker(0)], view(node(0), node(3, age=1.0)))) == []
    (kind, body), = nudges(plan([worker(0)], view(node(0), node(3, age=3.0))))
    assert (kind, body["addr"]) == ("remove", IP[3])
    assert body["heartbeatBefore"] == (NOW - timedelta(seconds=1.5)).timestamp()  # 1.5 keep-alives of 1 s


def test_a_frozen_peer_whose_pod_is_not_ready_is_removed_the_survivors_restarted_and_its_pod_stopped():
    pods = [worker(0), worker(1, ready=False), worker(2)]
    result = plan(pods, view(node(0), node(1, age=7.0), node(2)), replicas=3)
    kinds = [kind for kind, _ in nudges(result)]
    assert kinds == ["remove", "restart"] and nudges(result)[1][1] == {"round": 4}
    stop = next(a for a in result.actions if isinstance(a, planner.DeletePod))
    assert stop.name == "train-worker-1" and stop.event.reason == "Partitioned"
    assert result.status.infrastructure_failures == 1 and result.status.restarts == 0
    # Seen again before the pod is gone: counted once.
    again = planner.plan(job(result.status.model_dump(by_alias=True, mode="json"), replicas=3),
                         observed([rdzv()] + pods, store=view(node(0), node(1, age=8.0), node(2))), NOW)
    assert again.status.infrastructure_failures == 1


@pytest.mark.parametrize("age", [7.0, 60.0, 1e6])
def test_an_old_heartbeat_written_for_a_ready_pod_never_stops_it(age):
    """Anyone who reaches the store's port can write a round listing a healthy worker's IP with an old heartbeat:
    that is the store's word alone. The agent leaves the tenant's own rendezvous (its survivors restart), but
    its pod, Ready to the operator, is not deleted and no failure is booked."""
    pods = [worker(0), worker(1), worker(2)]
    result = plan(pods, view(node(0), node(1, age=age), node(2)), replicas=3)
    assert [kind for kind, _ in nudges(result)] == ["remove", "restart"]
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod)]
    assert result.status.infrastructure_failures == 0 and result.status.last_failures == []
    assert result.status.counted_failures == []


@pytest.mark.parametrize(("stalled", "age", "cut"), [
    (True, 3.0, True),  # a missed heartbeat while no rank steps: every rank waits on it
    (False, 3.0, False),  # training goes on: a late heartbeat under load, torch's own limit decides
    (True, 1.4, False),  # stalled, but its heartbeats are on time: a slow step, a checkpoint being written
])
def test_a_silent_peer_is_cut_off_at_its_first_missed_heartbeat_when_the_training_stalls(stalled, age, cut):
    store = dataclasses.replace(view(node(0), node(1, age=age), node(2)),
                                progress=ProgressView(pod="train-worker-0", step=120, stalled=stalled))
    result = plan([worker(0), worker(1), worker(2)], store, replicas=3)
    assert [k for k, _ in nudges(result)] == (["remove", "restart"] if cut else [])
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod)], "the store's word: never stopped"
    assert [c.reason for c in result.cut_off] == (["TrainingStalled"] if cut else [])
    assert result.status.infrastructure_failures == 0


@pytest.mark.parametrize(("age", "unanswered", "cut"), [
    (1.6, 0.6, True),  # a missed heartbeat, and its kernel answers no probe of the store: cut off
    (1.6, None, False),  # a missed heartbeat alone, its kernel answering: a starved agent, torch's limit decides
    (1.4, 0.6, False),  # heartbeats on time: whatever the table says, no one waits on it
])
def test_a_silent_peer_whose_kernel_answers_nothing_is_cut_off_without_a_progress_report(age, unanswered, cut):
    """A script that reports no progress: the store cannot see its stall, so the kernel's word on the agent's
    address (elasticjob_store/peers.py) is what takes a cut-off agent out, 1.5 s after its last heartbeat."""
    silent = dataclasses.replace(node(1, age=age), unanswered=unanswered)
    result = plan([worker(0), worker(1), worker(2)], view(node(0), silent, node(2)), replicas=3)
    assert [k for k, _ in nudges(result)] == (["remove", "restart"] if cut else [])
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod)], "the store's word: never stopped"
    assert [c.reason for c in result.cut_off] == (["Unanswered"] if cut else [])
    assert result.status.infrastructure_failures == 0 and result.status.restarts == 0
    if cut:
        event = next(a.event for a in result.actions if isinstance(a, planner.StoreAction))
        assert "answered none of the store's TCP for 0.6s" in event.message, event.message


def test_the_kernels_word_seen_twice_or_late_takes_the_agent_out_once_and_never_stops_a_pod():
    """A doubled answer (the same state again, after the status write) keeps the pod left out once and books
    nothing; a late one, naming an address whose pod is gone or replaced by one not yet in the round, does
    nothing."""
    silent = dataclasses.replace(node(1, age=1.6), unanswered=0.6)
    pods = [worker(0), worker(1), worker(2)]
    first = plan(pods, view(node(0), silent, node(2)), replicas=3)
    again = planner.plan(job(first.status.model_dump(by_alias=True, mode="json"), replicas=3),
                         observed([rdzv()] + pods, store=view(node(0), silent, node(2))), NOW)
    assert again.status.rendezvous.left_out == first.status.rendezvous.left_out == ["uid-w1"]
    for result in (first, again):
        assert not [a for a in result.actions if isinstance(a, planner.DeletePod)]
        assert result.status.infrastructure_failures == 0 and result.status.restarts == 0
    late = plan([worker(0), worker(2)], view(node(0), silent, node(2)), replicas=3)  # its pod gone
    assert [c.reason for c in late.cut_off] == [] and "uid-w1" not in late.status.rendezvous.left_out


@pytest.mark.parametrize(("report_changed", "cut"), [
    (5.0, True),  # this round's training stepped (at 5 s), then stopped: every rank waits on the silent one
    (1.0, False),  # the report is the restarted world's (before the round completed at 2 s): a restart under way
])
def test_a_stall_counts_only_for_the_training_of_the_current_round(report_changed, cut):
    """A cold restart (warmStarts false) reports no step for seconds while its workers import torch, and a
    CPU-starved agent may miss a heartbeat meanwhile: cutting it off restarted the group again, and again (80 s
    after one scale-up, on real nodes)."""
    progress = ProgressView(pod="train-worker-0", step=120, stalled=True,
                            received_at=NOW - timedelta(seconds=10 - report_changed))
    store = dataclasses.replace(view(node(0), node(1, age=3.0), node(2)), progress=progress,
                                round_completed_at=NOW - timedelta(seconds=8))
    result = plan([worker(0), worker(1), worker(2)], store, replicas=3)
    assert [c.reason for c in result.cut_off] == (["TrainingStalled"] if cut else [])


def test_a_silent_peer_on_a_node_that_is_not_ready_is_cut_off_at_the_first_missed_heartbeat():
    pods = [worker(0), worker(1, node="node-b")]
    store = view(node(0), node(1, age=3.0))
    assert [k for k, _ in nudges(plan(pods, store))] == []
    result = planner.plan(job(running_status()), observed([rdzv()] + pods, store=store,
                                                          nodes={"node-b": False}), NOW)
    assert [k for k, _ in nudges(result)] == ["remove", "restart"]


def test_a_silent_peer_whose_pod_is_not_ready_is_cut_off_too():
    pods = [worker(0), worker(1, ready=False)]
    assert [k for k, _ in nudges(plan(pods, view(node(0), node(1, age=3.0))))] == ["remove", "restart"]


def test_a_forming_round_is_not_restarted():
    result = plan([worker(0), worker(1)], view(node(0), node(1, age=9.0), complete=False))
    assert "restart" not in [k for k, _ in nudges(result)]


def test_the_last_call_ends_once_every_live_agent_is_in():
    pods = [worker(0), worker(1), killed(2)]
    result = plan(pods, view(node(0), node(1), complete=False), replicas=3)
    assert ("complete", {"liveNodes": 2}) in nudges(result)


def test_no_early_completion_while_a_live_agent_is_still_coming():
    # worker-2 runs but its agent has not joined yet (still importing torch): the last call may bring it.
    result = plan([worker(0), worker(1), worker(2)], view(node(0), node(1), complete=False), replicas=3)
    assert nudges(result) == []


def test_the_round_the_survivors_form_does_not_wait_for_an_agent_taken_out_and_left_running():
    pods = [worker(0), worker(1), worker(2)]
    store = dataclasses.replace(view(node(0), node(1, age=3.0), node(2)),
                                progress=ProgressView(pod="train-worker-0", step=120, stalled=True))
    cut = plan(pods, store, replicas=3)
    assert cut.status.rendezvous.left_out == ["uid-w1"]
    # The survivors restarted and form the next round without worker-1, whose pod still runs (cut off).
    status = cut.status.model_dump(by_alias=True, mode="json")
    forming = planner.plan(job(status, replicas=3), observed([rdzv()] + pods, store=view(
        node(0), node(2), complete=False, round=5)), NOW)
    assert ("complete", {"liveNodes": 2}) in nudges(forming)
    assert forming.status.rendezvous.left_out == ["uid-w1"]
    # An answer from before the removal still lists its stale entry: still left out.
    late = planner.plan(job(status, replicas=3), observed([rdzv()] + pods, store=store), NOW)
    assert late.status.rendezvous.left_out == ["uid-w1"]
    # Its network healed: its agent waits to join, and is a live agent again.
    back = planner.plan(job(status, replicas=3), observed([rdzv()] + pods, store=view(
        node(0), node(2), round=5, waiting=(node(1),))), NOW)
    assert back.status.rendezvous.left_out == []
    # Its pod gone: nothing left to leave out.
    gone = planner.plan(job(status, replicas=3), observed([rdzv(), worker(0), worker(2)], store=view(
        node(0), node(2), round=5)), NOW)
    assert gone.status.rendezvous.left_out == []


def test_the_first_round_waits_its_last_call_for_a_worker_still_starting_on_its_node():
    # worker-2 is scheduled and initializing (the kit's init container): it joins within the last call, and a
    # round completed without it would restart the whole group before the first step.
    starting = worker(2, phase="Pending")
    assert nudges(plan([worker(0), worker(1), starting], view(node(0), node(1), complete=False, round=0),
                       replicas=3)) == [("hold", {"round": 0, "seconds": 10.0})]  # first_round.py
    # After a fault the survivors go on without it (it joins as a scale-up): recovery is not held up.
    assert ("complete", {"liveNodes": 2}) in nudges(plan([worker(0), worker(1), starting],
                                                         view(node(0), node(1), complete=False), replicas=3))
    # Not yet scheduled: it may never be; the round does not wait for it.
    unscheduled = worker(2, phase="Pending", node=None)
    assert ("complete", {"liveNodes": 2}) in nudges(plan([worker(0), worker(1), unscheduled],
                                                         view(node(0), node(1), complete=False, round=0),
                                                         replicas=3))


def test_survivors_re_forming_after_a_loss_do_not_wait_for_a_replacement_still_starting():
    # worker-1's pod was deleted at once; its replacement (a new pod, a new address) runs but its agent is seconds
    # from joining. The survivors of the last round are all in: the round completes, the replacement joins later.
    replacement = dataclasses.replace(worker(1), ip="10.244.0.99")
    last = (IP[0], IP[1], IP[2])
    forming = dataclasses.replace(view(node(0), node(2), complete=False, round=5), last_round_nodes=last)
    assert ("complete", {"liveNodes": 2}) in nudges(plan([worker(0), replacement, worker(2)], forming, replicas=3))
    # A worker of the last round that runs again (its container restarted in place) is still waited for.
    restarted = dataclasses.replace(forming, last_round_nodes=(IP[0], IP[1], IP[2]))
    assert nudges(plan([worker(0), worker(1), worker(2)], restarted, replicas=3)) == []
    # A newcomer in the round (a scale-up) waits for every live agent, as before.
    newcomer = dataclasses.replace(view(node(0), node(2), node(3), complete=False, round=5), last_round_nodes=last)
    assert nudges(plan([worker(0), replacement, worker(2), worker(3)], newcomer, replicas=4)) == []


def test_no_early_completion_below_min_or_with_nodes_waiting():
    assert nudges(plan([worker(0)], view(node(0), complete=False), minReplicas=2)) == []
    # An agent waits to join: torch completes the round with it; cutting the last call short would not.
    waiting = view(node(0), node(1), complete=False, waiting=[node(3)])
    assert [k for k, _ in nudges(plan([worker(0), worker(1)], waiting))] == []


def test_a_stale_agents_age_grows_from_when_the_store_answered():
    # Answered 4 s ago with a stale age of 2.6: 6.6 s now, past torch's 6 s.
    store = view(node(0), node(1, age=2.6), received=NOW - timedelta(seconds=4))
    assert [k for k, _ in nudges(plan([worker(0), worker(1)], store))] == ["remove", "restart"]


def test_a_fresh_agent_stays_fresh_between_answers():
    # The store answers a long-poll the moment a heartbeat goes stale: silence means fresh.
    store = view(node(0), node(1, age=1.5), received=NOW - timedelta(seconds=30))
    assert nudges(plan([worker(0), worker(1)], store)) == []


def test_a_closed_or_unknown_rendezvous_is_left_alone():
    closed = StoreView(epoch="e1", round=4, complete=True, closed=True, participants=(node(0),))
    assert nudges(plan([killed(0)], closed)) == []
    assert nudges(plan([killed(0)], None)) == []


def test_the_last_agent_of_a_round_is_never_cut_off_for_its_silence():
    """Rank 0's pod killed and its agent removed: the survivor, alone in the round, may go quiet while it
    restarts. No one waits on it in a collective, so its silence is no partition (it was fenced once, wrongly)."""
    result = plan([killed(0), worker(1)], view(node(1, age=7.0)))
    assert [k for k, _ in nudges(result)] == []
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod) and a.name == "train-worker-1"]
    assert result.status.infrastructure_failures == 0


@pytest.mark.parametrize(("stalled", "waiting", "removed"), [
    (True, True, True),  # its node lost: the survivors' workers failed, they wait to join, no rank steps
    (False, True, False),  # the training steps on (its report changed lately): torch's limit decides
    (True, False, False),  # no one waits to join: the last agent of a round, quiet while it restarts
])
def test_a_silent_agent_left_alone_in_the_round_is_taken_out_when_the_others_wait_on_it(stalled, waiting, removed):
    """A node lost: its pod stays Running to the API server, its processes are gone, the survivors' collectives
    failed and their agents wait to join the next round, which torch holds until the silent one expires (6 s)."""
    store = dataclasses.replace(
        view(node(1, age=3.0), waiting=(node(0), node(2)) if waiting else ()),
        progress=ProgressView(pod="train-worker-0", step=120, stalled=stalled))
    result = plan([worker(0), worker(1), worker(2)], store, replicas=3)
    assert [k for k, _ in nudges(result)] == (["remove"] if removed else []), "no restart: no one runs"
    assert result.status.rendezvous.left_out == (["uid-w1"] if removed else [])
    assert not [a for a in result.actions if isinstance(a, planner.DeletePod)]


def test_agents_all_silent_together_are_the_stores_problem_not_a_partition():
    result = plan([worker(0), worker(1)], view(node(0, age=7.0), node(1, age=7.0)))
    assert "restart" not in [k for k, _ in nudges(result)]


def test_a_store_with_its_nudges_off_gets_none_and_the_job_says_why_once():
    why = "torch 2.5.1+cu124's rendezvous keeps naive (timezone-less) times, which the store does not rewrite"
    store = dataclasses.replace(view(node(0), node(1), node(2)), nudges_off=why)
    result = plan([worker(0), killed(1), worker(2)], store, replicas=3)
    assert nudges(result) == []
    cond = next(c for c in result.status.conditions if c.type == "RendezvousNudges")
    assert (cond.status, cond.reason) == ("False", "TorchUnsupported") and "2.5.1+cu124" in cond.message
    (event,) = [e for e in result.events if e.reason == "RendezvousNudgesOff"]
    assert event.type == "Warning" and "2.5.1+cu124" in event.message
    status = result.status.model_dump(by_alias=True, exclude_none=True)
    again = planner.plan(job(status, replicas=3), observed([rdzv(), worker(0), killed(1), worker(2)],
                                                           store=store), NOW)
    assert [e for e in again.events if e.reason == "RendezvousNudgesOff"] == []


def test_a_new_store_still_checking_its_torch_gets_no_nudge_and_no_warning_until_its_verdict():
    checking = dataclasses.replace(view(node(0), node(1), node(2)), nudges_checked=False,
                                   nudges_off="checking this torch's rendezvous (nudges are off until it is done)")
    result = plan([worker(0), killed(1), worker(2)], checking, replicas=3)
    assert nudges(result) == []
    assert not any(c.type == "RendezvousNudges" for c in result.status.conditions)
    assert [e for e in result.events if e.reason == "RendezvousNudgesOff"] == []
    status = result.status.model_dump(by_alias=True, exclude_none=True)
    checked = planner.plan(job(status, replicas=3), observed([rdzv(), worker(0), killed(1), worker(2)],
                                                             store=view(node(0), node(1), node(2))), NOW)
    assert nudges(checked)


def test_a_store_with_its_nudges_on_adds_no_condition():
    result = plan([worker(0), killed(1), worker(2)], view(node(0), node(1), node(2)), replicas=3)
    assert nudges(result) and not any(c.type == "RendezvousNudges" for c in result.status.conditions)


def test_agents_that_ran_plain_torchrun_show_on_the_job_with_one_event():
    why = "2 agent start(s) ran plain torchrun instead of elasticjob_warm's: torch 2.99.0 is outside the range"
    store = dataclasses.replace(view(node(0), node(1)), plain_torchrun=why)
    result = plan([worker(0), worker(1)], store)
    cond = next(c for c in result.status.conditions if c.type == "WarmStarts")
    assert (cond.status, cond.reason, cond.message) == ("False", "PlainTorchrun", why)
    assert [e.message for e in result.events if e.reason == "WarmStartsOff"] == [why]
    status = result.status.model_dump(by_alias=True, exclude_none=True)
    again = planner.plan(job(status), observed([rdzv(), worker(0), worker(1)], store=store), NOW)
    assert [e for e in again.events if e.reason == "WarmStartsOff"] == []


class CountingObserved(planner.Observed):
    """Counts each time a plan lists the job's workers: a scan of every pod."""

    scans = 0

    @property
    def workers(self):
        CountingObserved.scans += 1
        return super().workers


def scans_for(agents: int) -> int:
    """A plan of a running round of `agents` agents (maxReplicas of them) and as many waiting, one of them
    silent: every per-agent path (removals, cut-offs, early completion) runs."""
    ips = [f"10.1.{i // 256}.{i % 256}" for i in range(agents)]
    pods = [worker(i, ip=ip, node=f"node-{i}") for i, ip in enumerate(ips)]
    participants = tuple(StoreNode(ip, 9.0 if i == 0 else 0.5, i == 0) for i, ip in enumerate(ips))
    waiting = tuple(StoreNode(f"10.2.{i // 256}.{i % 256}", 9.0, True) for i in range(agents))
    store = StoreView(epoch="e1", round=4, complete=True, participants=participants, waiting=waiting,
                      received_at=NOW)
    CountingObserved.scans = 0
    planner.plan(job(running_status(), minReplicas=1, maxReplicas=agents, replicas=agents),
                 CountingObserved(pods=[rdzv()] + pods, service=SERVICE, store=store), NOW)
    return CountingObserved.scans


def test_planning_scans_the_pods_a_fixed_number_of_times_however_many_agents_the_store_lists():
    """Linear in the agents the store reports: the pods are indexed by address once per plan, never scanned per
    agent (that was 216 ms a plan at 4096 agents). Counted, not timed."""
    assert scans_for(1024) == scans_for(8)
