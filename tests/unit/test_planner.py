"""The planner's decisions, table by table: from a job and its observed pods to status and actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factory import (
    NOW,
    SERVICE,
    condition,
    creates,
    deletes,
    failed,
    job,
    observed,
    rdzv,
    running_status,
    store,
    template,
    worker,
)

from elasticjob import planner
from elasticjob.observe import PodView


def plan(j, pods, service=SERVICE, now=NOW, **seen):
    return planner.plan(j, observed(pods, service, **seen), now)


# --- start-up and scaling ---------------------------------------------------------------------------------


def test_a_new_job_gets_its_rendezvous_service_before_any_worker():
    result = plan(job(), [], service=None)
    assert creates(result, "Service") == ["train-rdzv"]
    assert creates(result, "Pod") == ["train-rdzv"]  # the store pod, but no worker without a ClusterIP
    assert result.status.phase == "Pending"
    assert result.requeue_after <= 1


def test_a_new_jobs_first_pending_posts_no_event_a_job_falling_back_to_pending_does():
    first = plan(job(), [], service=None)
    assert [e.reason for e in first.events] == []  # the creates carry their own Events
    fallen = plan(job(running_status()), [rdzv(), worker(0, ready=False), worker(1, ready=False)])
    assert fallen.status.phase == "Pending"
    assert "Waiting" in [e.reason for e in fallen.events]


def test_a_new_jobs_first_running_posts_no_event_running_again_after_an_incident_does():
    pending = {"phase": "Pending", "reason": "Waiting", "startTime": "2026-01-01T11:00:00Z"}
    first = plan(job(pending), [rdzv(), worker(0), worker(1)])
    assert first.status.phase == "Running" and first.events == []  # the Running condition and phase say it
    lost_store = {**pending, "rendezvous": {"restarts": 1, "endpoint": "10.96.0.42:29400"}}
    again = plan(job(lost_store), [rdzv(), worker(0), worker(1)])
    assert again.status.phase == "Running" and [e.reason for e in again.events] == ["Running"]


def test_the_services_event_says_only_that_it_was_made_again():
    start = plan(job(), [], service=None).actions
    (first,) = [a for a in start if a.manifest["kind"] == "Service"]
    assert first.event is None  # every job gets one at its start
    policies = [a for a in start if a.manifest["kind"] == "NetworkPolicy"]
    assert [p.manifest["metadata"]["name"] for p in policies] == ["elasticjob-rendezvous", "elasticjob-workers"]
    # the namespace's, made once for all its jobs
    assert all(p.per_namespace for p in policies) and not first.per_namespace
    (again,) = [a for a in plan(job(running_status()), [rdzv(), worker(0), worker(1)], service=None).actions
                if getattr(a, "manifest", {}).get("kind") == "Service"]
    assert again.event.reason == "RendezvousCreated" and "10.96.0.42:29400" in again.event.message


def test_workers_are_created_once_the_service_has_a_cluster_ip():
    result = plan(job(), [rdzv(ready=False)])
    assert creates(result) == ["train-worker-0", "train-worker-1"]
    env = {e["name"]: e.get("value") for e in _created(result, "train-worker-0")["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "10.96.0.42:29400"  # the ClusterIP: no DNS race at start


@pytest.mark.parametrize("replicas, pods, want_created, want_deleted", [
    (2, [0, 1], [], []),
    (3, [0, 1], ["train-worker-2"], []),
    (1, [0, 1, 2], [], [("train-worker-1", None), ("train-worker-2", None)]),  # highest indexes, graceful
    (2, [1], ["train-worker-0"], []),  # a gap is filled
])
def test_scaling_keeps_exactly_replicas_pods(replicas, pods, want_created, want_deleted):
    result = plan(job(running_status(), replicas=replicas), [rdzv()] + [worker(i) for i in pods])
    assert creates(result) == want_created
    assert deletes(result) == want_deleted


def test_terminating_pods_are_neither_recreated_nor_deleted_again():
    leaving = worker(2, deleting=True, deletion_time=NOW)
    result = plan(job(running_status(), replicas=2), [rdzv(), worker(0), worker(1), leaving])
    assert creates(result) == [] and deletes(result) == []


def test_missing_replicas_is_defaulted_to_max_replicas():
    result = plan(job(replicas=None), [rdzv()])
    assert planner.DefaultReplicas(3) in result.actions
    assert creates(result) == ["train-worker-0", "train-worker-1", "train-worker-2"]


@pytest.mark.parametrize("ready_workers, rdzv_ready, phase", [
    (2, True, "Running"),
    (1, True, "Running"),  # min is 1: elastic
    (0, True, "Pending"),
    (2, False, "Running"),  # the store is coming back: the workers train on (StoreComingBack)
])
def test_phase_follows_ready_workers_and_the_store(ready_workers, rdzv_ready, phase):
    pods = [rdzv(ready=rdzv_ready)] + [worker(i, ready=i < ready_workers) for i in range(2)]
    result = plan(job(running_status()), pods)
    assert result.status.phase == phase
    assert result.status.ready_replicas == ready_workers
    assert condition(result, "RendezvousReady") == str(rdzv_ready)


def test_a_running_job_whose_store_is_lost_says_it_is_coming_back_and_a_new_job_waits_for_its_store():
    lost = plan(job(running_status()), [rdzv(ready=False), worker(0), worker(1)])
    assert (lost.status.phase, lost.status.reason) == ("Running", "StoreComingBack")
    assert "train on" in lost.status.message and "10.96.0.42:29400" in lost.status.message
    pending = {"phase": "Pending", "reason": "Waiting", "startTime": "2026-01-01T11:00:00Z"}
    new = plan(job(pending), [rdzv(ready=False), worker(0), worker(1)])
    assert (new.status.phase, new.status.reason) == ("Pending", "Waiting")


def test_unschedulable_workers_are_reported_while_the_job_runs_with_min():
    pods = [rdzv(), worker(0), worker(1, phase="Pending", ready=False, node=None,
                                         unschedulable="0/2 nodes are available: 2 Insufficient cpu")]
    result = plan(job(running_status()), pods)
    assert result.status.phase == "Running"
    assert "1 unschedulable: 0/2 nodes are available" in result.status.message


# --- failures and the restart budget ----------------------------------------------------------------------


def test_a_failed_worker_is_recorded_then_deleted_and_counted_once():
    first = plan(job(running_status()), [rdzv(), worker(0), failed(1, exit_code=137)])
    assert first.status.restarts == 1
    assert first.status.last_failures[0].reason == "Killed"
    assert deletes(first) == [("train-worker-1", 0)]
    assert first.status.phase == "Restarting"
    assert any(e.reason == "WorkerFailed" for e in first.events)
    # The operator restarts before the pod is gone: the same pod is not counted again.
    again = plan(job(first.status.model_dump(by_alias=True, mode="json")), [rdzv(), worker(0), failed(1, 137)])
    assert again.status.restarts == 1
    assert not any(e.reason == "WorkerFailed" for e in again.events)


def test_agents_get_a_budget_they_never_reach_the_operator_enforces_max_restarts():
    status = running_status(restarts=2, lastRestartTime="2026-01-01T11:50:00Z")
    result = plan(job(status, maxRestarts=3), [rdzv(), worker(0)])
    pod = _created(result, "train-worker-1")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_MAX_RESTARTS"] == "10000"


def test_failures_close_together_are_one_restart():
    pods = [rdzv(), failed(0, ago=1.0, uid="a"), failed(1, ago=3.0, uid="b")]
    result = plan(job(running_status()), pods)
    assert result.status.restarts == 1
    assert len(result.status.last_failures) == 2


def test_failures_far_apart_are_separate_restarts():
    status = running_status(restarts=1, lastRestartTime="2026-01-01T11:58:00Z")
    result = plan(job(status), [rdzv(), worker(0), failed(1)])
    assert result.status.restarts == 2


@pytest.mark.parametrize("max_restarts, restarts_before, phase", [
    (3, 2, "Restarting"),
    (3, 3, "Failed"),
    (0, 0, "Failed"),
])
def test_exceeding_max_restarts_fails_the_job(max_restarts, restarts_before, phase):
    status = running_status(restarts=restarts_before, lastRestartTime="2026-01-01T11:00:00Z")
    result = plan(job(status, maxRestarts=max_restarts), [rdzv(), worker(0), failed(1, exit_code=3)])
    assert result.status.phase == phase
    if phase == "Failed":
        assert result.status.reason == "MaxRestartsExceeded"
        assert "exit code 3" in result.status.message and "train-worker-1" in result.status.message
        assert creates(result) == []


def test_an_agent_that_used_up_its_budget_fails_the_job_with_the_workers_exit_code():
    pod = failed(0, exit_code=1, worker_exit_code=7, agent_gave_up=True)
    result = plan(job(running_status(), maxRestarts=2), [rdzv(), pod, worker(1)])
    assert (result.status.phase, result.status.reason) == ("Failed", "MaxRestartsExceeded")
    assert "exit code 7" in result.status.message and "torchrun used up its restart budget" in result.status.message
    assert result.status.restarts == 2
    # The rest of the group is stopped; the store goes too.
    assert ("train-worker-1", None) in deletes(result) and ("train-rdzv", None) in deletes(result)


@pytest.mark.parametrize("worker_exit, fatal, reason", [
    (42, [42], "FatalExitCode"),
    (42, [3, 42], "FatalExitCode"),
    (41, [42], None),
])
def test_fatal_exit_codes_fail_at_once(worker_exit, fatal, reason):
    pod = failed(0, exit_code=1, worker_exit_code=worker_exit)
    result = plan(job(running_status(), failurePolicy={"fatalExitCodes": fatal}), [rdzv(), pod, worker(1)])
    assert result.status.reason == (reason or "Restarting")
    if reason:
        assert result.status.phase == "Failed" and f"{worker_exit} is in failurePolicy" in result.status.message
        assert creates(result) == []


@pytest.mark.parametrize("disruption, charged_flag, restarts", [
    ("Evicted", False, 0),
    ("Preempted", False, 0),
    ("NodeLost", False, 0),
    ("NodeLost", True, 1),
])
def test_infrastructure_failures_are_reported_but_not_charged(disruption, charged_flag, restarts):
    pod = failed(1, exit_code=137, disruption=disruption)
    j = job(running_status(), failurePolicy={"countInfrastructureFailures": charged_flag})
    result = plan(j, [rdzv(), worker(0), pod])
    assert result.status.restarts == restarts
    assert result.status.last_failures[0].reason == disruption
    assert result.status.infrastructure_failures == (0 if charged_flag else 1)


def test_worker_failures_right_after_losing_the_store_are_not_charged():
    status = running_status(rendezvous={"ready": True, "lastLostTime": "2026-01-01T11:59:50Z",
                                        "endpoint": "10.96.0.42:29400"})
    result = plan(job(status), [rdzv(), failed(0, ago=2), failed(1, ago=2, uid="x")])
    assert result.status.restarts == 0
    assert {f.reason for f in result.status.last_failures} == {"RendezvousLost"}


def test_losing_the_store_pod_recreates_it_and_says_so():
    result = plan(job(running_status()), [worker(0), worker(1)])
    assert creates(result) == ["train-rdzv"]
    assert result.status.rendezvous.restarts == 1
    assert result.status.rendezvous.last_lost_time == "2026-01-01T12:00:00.000Z"
    assert any(e.reason == "RendezvousLost" for e in result.events)


@pytest.mark.parametrize("node_ready, forced, why", [
    (None, True, "its node node-a no longer exists"),
    (False, True, "its node node-a is not Ready"),
    (True, False, None),       # its kubelet is alive: it finishes the pod, or a finalizer holds it on purpose
    ("unknown", False, None),  # not looked up yet
])
def test_pods_stuck_terminating_are_force_deleted_only_when_no_kubelet_can_confirm(node_ready, forced, why):
    stuck = worker(1, deleting=True, deletion_time=NOW - timedelta(seconds=20))
    fresh = worker(2, deleting=True, deletion_time=NOW - timedelta(seconds=5))
    nodes = {} if node_ready == "unknown" else {"node-a": node_ready}
    result = plan(job(running_status(), replicas=3), [rdzv(), worker(0), stuck, fresh], nodes=nodes)
    assert deletes(result) == ([("train-worker-1", 0)] if forced else [])
    if forced:
        event = next(a.event for a in result.actions if isinstance(a, planner.DeletePod))
        assert why in event.message
    assert result.requeue_after <= 10
    assert planner.stuck_nodes([stuck, fresh], NOW) == {"node-a"}


def test_a_pod_already_forced_is_not_forced_again():
    held = worker(1, deleting=True, deletion_time=NOW - timedelta(seconds=60), deletion_grace=0)
    result = plan(job(running_status()), [rdzv(), worker(0), held], nodes={"node-a": False})
    assert deletes(result) == []


# --- success, suspension, deadlines, TTL ------------------------------------------------------------------


def test_never_succeeded_while_a_worker_still_runs():
    result = plan(job(running_status()), [rdzv(), worker(0, "Succeeded"), worker(1)])
    assert result.status.phase == "Running" and result.status.reason == "Completing"
    assert creates(result) == []


def test_a_worker_that_exited_zero_before_its_pod_turned_succeeded_means_completing_not_waiting():
    # A real kubelet's first update after the exit: phase Running, Ready False, the container terminated with 0.
    exited = [worker(i, ready=False, exit_code=0, worker_exit_code=0, finished_at=NOW) for i in (0, 1)]
    result = plan(job(running_status()), [rdzv(), *exited])
    assert (result.status.phase, result.status.reason) == ("Running", "Completing")
    assert creates(result) == [] and [d for d in deletes(result) if d[0].startswith("train-worker")] == []


def test_succeeded_when_every_worker_exited_zero():
    result = plan(job(running_status()), [rdzv(), worker(0, "Succeeded"), worker(1, "Succeeded")])
    assert result.status.phase == "Succeeded"
    assert result.status.completion_time == "2026-01-01T12:00:00Z"
    assert condition(result, "Succeeded") == "True" and condition(result, "Running") == "False"
    assert ("train-rdzv", None) in deletes(result)
    assert any(isinstance(a, planner.DeleteService) for a in result.actions)


def test_a_finished_job_stays_finished():
    status = {**running_status(), "phase": "Succeeded", "reason": "Succeeded",
              "completionTime": "2026-01-01T11:59:00Z"}
    result = plan(job(status), [worker(0, "Failed", exit_code=1)])
    assert result.status.phase == "Succeeded" and result.status.restarts == 0


@pytest.mark.parametrize("policy, expected", [
    ("Running", [("train-worker-1", None)]),
    ("All", [("train-worker-0", None), ("train-worker-1", None)]),
    ("None", []),
])
def test_clean_pod_policy_after_finishing(policy, expected):
    status = {"phase": "Failed", "reason": "MaxRestartsExceeded", "completionTime": "2026-01-01T11:59:00Z"}
    result = plan(job(status, runPolicy={"cleanPodPolicy": policy}), [worker(0, "Failed"), worker(1)])
    assert deletes(result) == expected


@pytest.mark.parametrize("ago, deleted", [(30, False), (3600, True)])
def test_ttl_after_finished_deletes_the_job(ago, deleted):
    done = (NOW - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"phase": "Succeeded", "reason": "Succeeded", "completionTime": done}
    result = plan(job(status, runPolicy={"ttlSecondsAfterFinished": 600}), [])
    assert (planner.DeleteJob() in result.actions) is deleted


def test_suspend_stops_every_pod_and_resume_starts_again():
    pods = [rdzv(), worker(0), worker(1)]
    suspended = plan(job(running_status(), runPolicy={"suspend": True}), pods)
    assert suspended.status.phase == "Suspended"
    # The store last: the workers' agents ask it on SIGTERM whether a planned stop was saved.
    assert [name for name, _ in deletes(suspended)] == ["train-worker-0", "train-worker-1"]
    leaving = [rdzv(), worker(0, deleting=True), worker(1, deleting=True)]
    status = suspended.status.model_dump(by_alias=True, mode="json")
    assert deletes(plan(job(status, runPolicy={"suspend": True}), leaving)) == []
    assert [name for name, _ in deletes(plan(job(status, runPolicy={"suspend": True}), [rdzv()]))] == ["train-rdzv"]
    resumed = plan(job(suspended.status.model_dump(by_alias=True, mode="json")), [], service=SERVICE)
    assert resumed.status.phase == "Pending" and "train-rdzv" in creates(resumed)


def test_active_deadline_fails_the_job():
    status = running_status(startTime="2026-01-01T11:00:00Z")
    result = plan(job(status, runPolicy={"activeDeadlineSeconds": 1800}), [rdzv(), worker(0), worker(1)])
    assert (result.status.phase, result.status.reason) == ("Failed", "DeadlineExceeded")


# --- invalid specs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("container, nproc, message", [
    ({"command": None}, 1, "has no command"),
    ({"image": None}, 1, "has no image"),
    ({"env": [{"name": "PET_NNODES", "value": "4"}]}, 1, "sets PET_NNODES"),
    ({"env": [{"name": "WORLD_SIZE", "value": "4"}]}, 1, "sets WORLD_SIZE"),
    ({"resources": {"limits": {"nvidia.com/gpu": 2}}}, 4, "nprocPerNode 4 exceeds the 2 GPUs"),
])
def test_invalid_specs_fail_with_a_message_that_says_what_to_fix(container, nproc, message):
    tpl = template(**container)
    tpl["spec"]["containers"][0] = {k: v for k, v in tpl["spec"]["containers"][0].items() if v is not None}
    result = plan(job(template=tpl, nprocPerNode=nproc), [])
    assert (result.status.phase, result.status.reason) == ("Failed", "InvalidSpec")
    assert message in result.status.message
    assert creates(result) == [] and condition(result, "Failed") == "True"


def test_rejected_objects_turn_into_invalid_spec():
    j = job(running_status())
    result = planner.reject(j, j.status, "the API server rejected: spec.containers[0].image: Required", NOW)
    assert (result.status.phase, result.status.reason) == ("Failed", "InvalidSpec")
    assert [e.type for e in result.events] == ["Warning"]


# --- status bookkeeping -----------------------------------------------------------------------------------


def test_status_carries_selector_generation_and_run_id():
    result = plan(job(generation=7), [rdzv()])
    assert result.status.selector == "elasticjob.dev/job-name=train,elasticjob.dev/role=worker"
    assert result.status.observed_generation == 7
    assert result.status.rendezvous.run_id == "0b7c6a52-1111-2222-3333-444455556666"


def test_condition_transition_time_changes_only_on_a_flip():
    first = plan(job(running_status()), [rdzv(), worker(0), worker(1)])
    later = plan(job(first.status.model_dump(by_alias=True, mode="json")), [rdzv(), worker(0), worker(1)],
                 now=NOW + timedelta(minutes=5))
    running = next(c for c in later.status.conditions if c.type == "Running")
    assert running.status == "True" and running.last_transition_time == "2026-01-01T12:00:00Z"
    assert later.events == []


def test_a_steady_job_plans_nothing():
    steady = plan(job(running_status()), [rdzv(), worker(0), worker(1)])
    again = plan(job(steady.status.model_dump(by_alias=True, mode="json")), [rdzv(), worker(0), worker(1)])
    assert again.actions == [] and again.events == []
    assert again.status == steady.status


def _created(result: planner.Plan, name: str) -> dict:
    return next(a.manifest for a in result.actions
                if isinstance(a, planner.CreateObject) and a.manifest["metadata"]["name"] == name)


def test_pod_view_counts_terminating_pods_as_inactive():
    assert not PodView(name="x", uid="u", role="worker", index=0, phase="Running", deleting=True).active


def test_agents_that_lost_their_store_are_replaced_without_charge():
    # The store's container was restarted in place 2 s ago, too briefly for the operator to see it stop serving.
    store = rdzv(restarted_at=NOW - timedelta(seconds=2))
    pods = [store, failed(0, says_store_lost=True), failed(1, uid="x")]
    result = plan(job(running_status()), pods)
    assert result.status.restarts == 0 and result.status.phase != "Failed"
    assert {f.reason for f in result.status.last_failures} == {"RendezvousLost"}
    assert deletes(result) == [("train-worker-0", 0), ("train-worker-1", 0)]


def test_a_pod_saying_it_lost_its_store_waits_for_the_evidence_then_is_charged_without_it():
    # The workload printed what torch prints when the store goes; the store never went.
    early = plan(job(running_status()), [rdzv(), worker(0), failed(1, says_store_lost=True, ago=1)])
    assert early.status.last_failures == [] and deletes(early) == [] and early.requeue_after <= 4
    late = plan(job(running_status()), [rdzv(), worker(0), failed(1, says_store_lost=True, ago=6)])
    assert [(f.reason, f.charged) for f in late.status.last_failures] == [("Error", True)]
    assert late.status.restarts == 1


def test_a_replacement_that_fails_at_once_is_a_new_restart():
    # Restart 1 happened 3 s ago; its replacement (created at generation 1) failed too: restart 2.
    status = running_status(restarts=1, lastRestartTime="2026-01-01T11:59:57Z")
    result = plan(job(status), [rdzv(), worker(0, generation=0), failed(1, generation=1)])
    assert result.status.restarts == 2


def test_a_survivor_failing_with_the_last_restart_is_the_same_restart():
    status = running_status(restarts=1, lastRestartTime="2026-01-01T11:59:57Z")
    result = plan(job(status), [rdzv(), failed(0, generation=0), worker(1, generation=1)])
    assert result.status.restarts == 1


def test_new_workers_carry_the_restart_generation():
    status = running_status(restarts=2, lastRestartTime="2026-01-01T11:00:00Z")
    result = plan(job(status), [rdzv(), worker(0)])
    annotations = _created(result, "train-worker-1")["metadata"]["annotations"]
    assert annotations["elasticjob.dev/restart-generation"] == "2"


def test_a_straggler_failing_after_training_finished_is_not_charged():
    pods = [rdzv(), worker(0, "Succeeded"), failed(1, exit_code=137)]
    result = plan(job(running_status()), pods)
    assert result.status.phase == "Succeeded" and result.status.restarts == 0
    assert result.status.last_failures[0].charged is False
    assert all(e.reason != "WorkerFailed" for e in result.events)


def test_a_pod_stopped_by_scale_down_is_not_a_failure():
    leaving = failed(2, exit_code=143, deleting=True, deletion_time=NOW)
    result = plan(job(running_status(), replicas=2), [rdzv(), worker(0), worker(1), leaving])
    assert result.status.restarts == 0 and result.status.last_failures == []


def test_an_evicted_pod_being_deleted_is_recorded():
    evicted = worker(1, deleting=True, deletion_time=NOW, disruption="Evicted")
    result = plan(job(running_status()), [rdzv(), worker(0), evicted])
    assert [f.reason for f in result.status.last_failures] == ["Evicted"]
    assert result.status.restarts == 0


def test_the_rendezvous_round_and_nodes_are_reported():
    result = plan(job(running_status()), [rdzv(), worker(0), worker(1)], store=store(round=3, nodes=2))
    assert (result.status.rendezvous.round, result.status.rendezvous.nodes) == (3, 2)
    unknown = plan(job(result.status.model_dump(by_alias=True, mode="json")), [rdzv(), worker(0)])
    assert unknown.status.rendezvous.round == 3, "an unreadable store keeps the last known round"


def test_a_store_held_back_by_the_kubelet_after_kills_is_replaced_by_a_new_pod():
    """The kubelet's back-off doubles with each kill (up to 5 minutes with no store); a new pod starts at once.
    A store that cannot start (exit 1) keeps the kubelet's back-off."""
    from tests.unit.factory import NOW, job, observed, rdzv, running_status, worker

    held = rdzv(ready=False, killed_and_backed_off=True)
    result = planner.plan(job(running_status()), observed([held, worker(0), worker(1)]), NOW)
    deletes = [a for a in result.actions if isinstance(a, planner.DeletePod) and a.name == "train-rdzv"]
    assert len(deletes) == 1 and deletes[0].grace_seconds == 0
    assert deletes[0].event is not None and deletes[0].event.reason == "RendezvousRecreated"  # once it is gone
    crashing = planner.plan(job(running_status()), observed([rdzv(ready=False), worker(0), worker(1)]), NOW)
    assert not [a for a in crashing.actions if isinstance(a, planner.DeletePod)]


def test_a_worker_that_cannot_start_is_named_in_the_jobs_message():
    from tests.unit.factory import NOW, job, observed, rdzv, running_status, worker

    stuck = worker(1, phase="Pending", ready=False,
                   cannot_start="container elasticjob-kit: ImagePullBackOff: Back-off pulling image")
    result = planner.plan(job(running_status()), observed([rdzv(), worker(0), stuck]), NOW)
    assert "1 cannot start: pod train-worker-1, container elasticjob-kit: ImagePullBackOff" in result.status.message


def test_a_store_that_cannot_start_is_named_in_the_jobs_message():
    from tests.unit.factory import NOW, job, observed, rdzv, worker

    stuck = rdzv(ready=False, phase="Pending", cannot_start="container elasticjob-kit: ErrImagePull: no such host")
    result = planner.plan(job(), observed([stuck, worker(0), worker(1)]), NOW)
    assert ("waiting for the rendezvous store (pod train-rdzv cannot start: container elasticjob-kit: ErrImagePull"
            in result.status.message)
