"""Planned stops on real nodes (issue 38): examples/train_ddp.py asks elasticjob_progress's should_stop(), so
before the operator removes workers it chose to remove, and when a worker pod is evicted (the Eviction API, as
`kubectl drain` uses: the evicted pod's agent asks on SIGTERM, elasticjob_warm/evicted.py), every rank stops
after one agreed step and rank 0 saves it; the pods go only then. The next step after the restart is the one after the agreed stop (0 steps lost),
nothing is charged, and the job's downtime ledger shows 0 s recomputed.

A checkpoint every 1000 steps: any step not lost is the planned stop's doing, not a periodic save's.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from e2e_support import job_manifest, parse_events, summary, train_args
from helpers import wait_for
from kueue_support import Queues, kueue, queued, queues  # noqa: F401 (fixtures)
from test_kueue_training import START_TIMEOUT, Training, kueue_job, kueue_operator, trainings  # noqa: F401
from test_training import RECOVERY_TIMEOUT, finish, recovery, start

STEPS = 300
STEP_SECONDS = 0.1
GRACE = 30


def stop_events(events: list[dict], after: float) -> list[dict]:
    return [e for e in events if e.get("event") == "checkpoint-on-stop" and e["time"] >= after]


def job_events(jobs, since: float) -> str:
    """The job's Events from `since` on, in seconds after it: what to read when the ledger is not as expected."""
    found = []
    for event in jobs.core.list_namespaced_event(jobs.namespace).items:
        when = event.event_time or event.last_timestamp or event.first_timestamp
        if when is not None and when.timestamp() >= since - 30:
            found.append((when.timestamp() - since, f"{event.involved_object.name} {event.reason}: {event.message}"))
    return "\n  ".join(f"{at:+.1f} s {what}" for at, what in sorted(found))


def closed_incident(jobs, kind: str, name: str | None = None) -> dict:
    ledger = wait_for(lambda: (jobs.status(name) if name else jobs.status()).get("goodput") or {},
                      RECOVERY_TIMEOUT, f"a {kind} incident closed",
                      until=lambda g: any(i["kind"] == kind for i in g.get("lastIncidents") or []))
    return next(i for i in reversed(ledger["lastIncidents"]) if i["kind"] == kind)


@pytest.mark.slow  # make e2e: test_training's scale-downs (in make test) take the same planned stop
def test_a_scale_down_stops_at_an_agreed_step_and_loses_none(operator, jobs, progress, record_recovery):
    manifest = job_manifest(jobs.namespace, replicas=3, max_restarts=1,
                            train_args=train_args(STEPS, step_seconds=STEP_SECONDS, checkpoint_every=1000))
    manifest["spec"]["runPolicy"]["stopGraceSeconds"] = GRACE
    start(jobs, progress, manifest, world_size=3, min_step=20)
    scaled_at = time.time()
    jobs.scale(2)
    shrunk = recovery(progress, scaled_at, "scaling to 2", world_size=2)
    stops = stop_events(progress.events(), scaled_at)
    assert {e["rank"] for e in stops} == {0, 1, 2}, f"not every rank stopped at the agreed step: {stops}"
    agreed = {e["step"] for e in stops}
    assert len(agreed) == 1, f"the ranks stopped at different steps: {stops}"
    (step,) = agreed
    assert shrunk["resumed_from"] == step and shrunk["step"] == step + 1, (
        f"the first step after the restart is {shrunk['step']} (resumed from {shrunk['resumed_from']}), "
        f"not the one after the agreed stop {step}")
    before = [r for r in progress().records if r["time"] < shrunk["time"] and r["world_size"] == 3]
    assert max(r["step"] for r in before) == step, "a rank stepped past the agreed stop"
    assert shrunk["time"] - scaled_at < GRACE, "the pods went on the grace, not on the stop"
    record_recovery("planned scale 3 -> 2", shrunk["time"] - scaled_at, 2, jobs.status().get("restarts"))
    incident = closed_incident(jobs, "ScaleChange")
    assert incident.get("stoppedStep") == step and incident["phases"]["recompute"] == 0.0, (
        f"{incident}\nledger: {jobs.status().get('goodput')}\nevents: {job_events(jobs, scaled_at)}")
    finish(jobs, progress, STEPS)
    status = jobs.status()
    assert (status.get("restarts"), status.get("infrastructureFailures")) == (0, 0), summary(status)
    assert not status.get("lastFailures") and status.get("plannedStop") is None, summary(status)
    reasons = [e.reason for e in jobs.core.list_namespaced_event(jobs.namespace).items]
    assert "StopRequested" in reasons and "StoppedAndSaved" in reasons and "StopGraceExpired" not in reasons



# The slow tier (`make e2e`): a race with the kubelet's kill 2 s after SIGTERM, which rank 0's step and save lost
# twice in full `make test` runs on 2 shared cores (2026-12-06; alone it passed every time). Kept where it runs
# unloaded until the save is made to fit the kill under load.
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["enforced", "none"])
def test_rank_0s_pod_deleted_at_once_saves_its_step_before_the_kubelets_kill(policy, request, operator_factory,
                                                                              jobs, progress, record_recovery):
    """A pod deleted with grace 0 (a force deletion; a lost node's eviction) is gone from the API at once, and
    its kubelet sends SIGTERM and, 2 s later, SIGKILL; no stop can be agreed with the store from then on. Its
    agent gives the store up at once and torchrun stops the workers: rank 0 saves the step it is on, well before
    the kill, and the survivors resume from it. Both ways the store is closed to the deleted pod: "enforced", the
    job's network policy drops its new connections; "none" (the operator's --no-network-policy, as where nothing
    enforces policies), its agent's connection reaches the store's gate, which refuses an address taken off the
    job's list at once (before, it held it as an unnamed pod's for 20 s, and the kill came before the save)."""
    if policy == "enforced":
        request.getfixturevalue("enforced_policies")
        operator_factory()
    else:
        operator_factory(extra_args=["--no-network-policy"])
    manifest = job_manifest(jobs.namespace, replicas=2, max_restarts=3,
                            train_args=train_args(STEPS, step_seconds=STEP_SECONDS, checkpoint_every=1000))
    before = start(jobs, progress, manifest, world_size=2, min_step=20)
    victim = before.rank0_host()
    deleted_at = time.time()
    jobs.core.delete_namespaced_pod(victim, jobs.namespace, grace_period_seconds=0)
    resumed = recovery(progress, deleted_at, f"deleting {victim} at once")
    saves = [e for e in progress.events() if e.get("event") == "checkpoint-on-sigterm" and e["time"] >= deleted_at]
    assert [e["rank"] for e in saves] == [0], f"rank 0 did not save on SIGTERM: {saves}"
    assert saves[0]["time"] - deleted_at < 2.0, f"saved {saves[0]['time'] - deleted_at:.1f}s after the deletion"
    assert resumed["resumed_from"] == saves[0]["step"], (
        f"resumed from step {resumed['resumed_from']}, not the step {saves[0]['step']} rank 0 saved")
    record_recovery(f"rank-0 pod {victim} deleted at once", resumed["time"] - deleted_at, resumed["world_size"],
                    jobs.status().get("restarts"))
    finish(jobs, progress, STEPS)


@pytest.mark.slow
def test_a_kueue_preemption_stops_at_an_agreed_step_and_the_job_resumes_after_it(kueue_operator, jobs,
                                                                                  queues: Queues, trainings,
                                                                                  record_timing):
    queues.make(cpu="4.2")
    low_class, high_class = queues.priority("low", 10), queues.priority("high", 1000)
    low = trainings("low")
    manifest = kueue_job(jobs, "low", steps=STEPS, priority=low_class)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [*container["command"][:2],
                            *train_args(STEPS, step_seconds=STEP_SECONDS, checkpoint_every=1000)]
    jobs.create(manifest)
    wait_for(low, START_TIMEOUT, "the low-priority job at step 20 with 3 workers",
             until=lambda p: any(r["step"] >= 20 and r["world_size"] == 3 for r in p.records))
    preempt = time.time()
    jobs.create(kueue_job(jobs, "high", steps=12, priority=high_class))
    jobs.wait_phase("Queued", 60 + GRACE, name="low")
    record_timing("preemptor created -> preempted job Queued (after its planned stop)", time.time() - preempt)
    stops = stop_events(events(low), preempt)
    agreed = {e["step"] for e in stops}
    assert len(agreed) == 1 and {e["rank"] for e in stops} == {0, 1, 2}, stops
    (step,) = agreed
    jobs.wait_phase("Succeeded", 150, name="high")
    high_done = time.time()
    resumed = wait_for(low, START_TIMEOUT, "the preempted job training again",
                       until=lambda p: p.first_after(high_done)).first_after(high_done)
    assert (resumed["resumed_from"], resumed["step"]) == (step, step + 1), resumed
    incident = closed_incident(jobs, "Preemption", "low")
    assert incident.get("stoppedStep") == step and incident["phases"]["recompute"] == 0.0, incident
    status = jobs.status("low")
    assert status.get("restarts") == 0 and not status.get("lastFailures"), summary(status)


def log_tail(jobs, pod, lines: int = 40) -> str:
    try:
        return jobs.core.read_namespaced_pod_log(pod.metadata.name, jobs.namespace, tail_lines=lines)
    except Exception as err:  # noqa: BLE001 (a pod already gone: say so instead)
        return f"(no log: {err})"


# Slow (make e2e): it failed once in its first three runs, with no stop saved and no log kept; it now keeps the
# evicted pod's log on a failure. Two reruns passed (7.4 s and 9.0 s to the next step, nothing charged).
@pytest.mark.slow
def test_an_evicted_worker_has_every_rank_save_an_agreed_step_first_and_loses_none(operator, jobs, progress,
                                                                                   record_recovery):
    """One worker pod evicted as `kubectl drain` evicts it: the kubelet's SIGTERM reaches its agent at once,
    which has the store pick a step; every rank stops after it and rank 0 saves it before torchrun stops the
    evicted pod's workers. The replacement's group resumes from that step."""
    manifest = job_manifest(jobs.namespace, replicas=3, max_restarts=1,
                            train_args=train_args(STEPS, step_seconds=STEP_SECONDS, checkpoint_every=1000))
    manifest["spec"]["runPolicy"]["stopGraceSeconds"] = GRACE
    del manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]  # the operator raises only the default
    start(jobs, progress, manifest, world_size=3, min_step=20)
    victim = next(p for p in jobs.worker_pods() if p.metadata.name.endswith("-worker-1"))
    assert victim.spec.termination_grace_period_seconds >= GRACE + 30, "the kubelet would cut the stop short"
    evicted_at = time.time()
    jobs.core.create_namespaced_pod_eviction(victim.metadata.name, jobs.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=victim.metadata.name, namespace=jobs.namespace)))
    try:
        stops = wait_for(lambda: stop_events(progress.events(), evicted_at), GRACE, "every rank saved the stop",
                         until=lambda found: {e["rank"] for e in found} == {0, 1, 2})
    except AssertionError as err:  # what the evicted pod's agent said of the SIGTERM (evicted.py), for the record
        raise AssertionError(f"{err}\n--- {victim.metadata.name}'s log, last lines:\n{log_tail(jobs, victim)}") from None
    agreed = {e["step"] for e in stops}
    assert len(agreed) == 1, f"the ranks stopped at different steps: {stops}"
    (step,) = agreed
    stopped_at = max(e["time"] for e in stops)
    resumed = recovery(progress, stopped_at, "the eviction", world_size=3)
    assert (resumed["resumed_from"], resumed["step"]) == (step, step + 1), (
        f"the first step after the eviction is {resumed['step']} (resumed from {resumed['resumed_from']}), not "
        f"the one after the agreed stop {step}")
    before = [r for r in progress().records if r["time"] < resumed["time"]]
    assert max(r["step"] for r in before) == step, "a rank stepped past the agreed stop"
    record_recovery("eviction of one worker of 3, saved first", resumed["time"] - evicted_at, 3,
                    jobs.status().get("restarts"))
    ledger = wait_for(lambda: jobs.status().get("goodput") or {}, RECOVERY_TIMEOUT, "the eviction's incident closed",
                      until=lambda g: any(i.get("stoppedStep") == step for i in g.get("lastIncidents") or []))
    incident = next(i for i in ledger["lastIncidents"] if i.get("stoppedStep") == step)
    assert incident["phases"]["recompute"] == 0.0, incident
    finish(jobs, progress, STEPS)


def events(training: Training) -> list[dict]:
    return parse_events(training.reader.read_text("events.jsonl"))
