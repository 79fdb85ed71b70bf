"""Admission by Kueue with real training (issue 10), on the local cluster's Kueue add-on.

A ClusterQueue holds 4 workers of 1 cpu (and the two stores' 100m each); the jobs have 3 workers (minReplicas 2).
- The second job waits Queued (partial admission would need 2 workers, 1 is free) until the first finishes,
  then trains (`make test`).
- A higher-priority job preempts a running one: the preempted job is suspended (its workers checkpoint on
  SIGTERM), the quota is released, the preemptor trains; then the preempted job is admitted again, resumes from
  its checkpoint, and its restarts stay 0 (`make e2e`).
- A training job scaled 2 -> 4 with room for 3 asks Kueue for a workload slice and trains on at world size 2,
  untouched, until quota frees; then Kueue admits the slice and it trains at world size 4, its live pods never
  asking for more CPU than the ClusterQueue has (`make test`).
Measured intervals are printed at the end of the session.
"""

from __future__ import annotations

import time

import pytest

from e2e_support import (
    HOST_ROOT,
    Jobs,
    LocalProgressReader,
    Progress,
    job_manifest,
    parse_progress,
    summary,
    train_args,
)
from helpers import wait_for
from kueue_support import Queues, QuotaWatch, kueue, queued, queues  # noqa: F401 (fixtures)

CHECKPOINT_EVERY = 5
START_TIMEOUT = 120
FINISH_TIMEOUT = 150
QUOTA_CPU = "4.2"  # 4 workers of 1 cpu, and two stores of 100m


@pytest.fixture
def kueue_operator(operator_factory):
    return operator_factory(extra_args=["--kueue"])


class Training:
    """What one of several jobs in the namespace trained: each writes to a checkpoint dir of its own."""

    def __init__(self, namespace: str, name: str):
        self.reader = LocalProgressReader(f"{namespace}/{name}")

    def __call__(self) -> Progress:
        return parse_progress(self.reader.read_text())


@pytest.fixture
def trainings(jobs: Jobs):
    made: list[Training] = []

    def make(name: str) -> Training:
        made.append(Training(jobs.namespace, name))
        return made[-1]

    yield make
    for training in made:
        training.reader.close()


def kueue_job(jobs: Jobs, name: str, steps: int, priority: str | None = None) -> dict:
    manifest = job_manifest(jobs.namespace, name=name, min_replicas=2, max_replicas=3, replicas=3,
                            train_args=train_args(steps, checkpoint_every=CHECKPOINT_EVERY))
    pod = manifest["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    pod["volumes"][0]["hostPath"]["path"] = str(HOST_ROOT / jobs.namespace / name)
    return queued(manifest, priority=priority)


def admitted_at(jobs: Jobs, name: str, timeout: float) -> float:
    wait_for(lambda: jobs.status(name), timeout, f"{name} admitted",
             until=lambda s: (s.get("admission") or {}).get("state") == "Admitted")
    return time.time()


def first_step_at(training: Training, after: float, timeout: float, what: str) -> dict:
    return wait_for(training, timeout, what, until=lambda p: p.first_after(after)).first_after(after)


def finished(jobs: Jobs, training: Training, name: str, steps: int) -> Progress:
    status = jobs.wait_phase("Succeeded", FINISH_TIMEOUT, name=name)
    done = training()
    missing = set(range(1, steps + 1)) - {r["step"] for r in done.records}
    assert done.last_step == steps and not missing, f"{name} incomplete (never done: {sorted(missing)}): {done}"
    assert status["restarts"] == 0, summary(status)
    return done


@pytest.mark.slow  # make e2e: the integration tier queues and admits jobs through the same Kueue
def test_the_second_job_waits_queued_until_the_first_finishes(kueue_operator, jobs, queues: Queues, trainings,
                                                              record_timing):
    queues.make(cpu=QUOTA_CPU)
    first, second = trainings("first"), trainings("second")
    created = time.time()
    jobs.create(kueue_job(jobs, "first", steps=16))
    start = first_step_at(first, created, START_TIMEOUT, "the first job's first step")
    record_timing("created -> first training step (admitted at once)", start["time"] - created)
    jobs.create(kueue_job(jobs, "second", steps=12))
    jobs.wait_phase("Queued", 60, name="second")
    # Queued before Kueue has looked at the Workload ("waiting for Kueue to admit ..."), then in Kueue's words.
    wait_for(lambda: jobs.status("second"), 30, "Kueue's reason on the queued job",
             until=lambda s: s.get("phase") == "Queued" and "insufficient unused quota" in (s.get("message") or ""))
    while jobs.status("first").get("phase") != "Succeeded":  # as long as the first runs, the second waits
        status = jobs.status("second")
        assert status["phase"] == "Queued" and not jobs.worker_pods("second"), summary(status)
        assert not second().records
        time.sleep(0.5)
    done_at = time.time()
    finished(jobs, first, "first", 16)
    admitted = admitted_at(jobs, "second", 60)
    step = first_step_at(second, done_at, START_TIMEOUT, "the second job's first step")
    record_timing("first finished -> second admitted", admitted - done_at)
    record_timing("second admitted -> its first training step", step["time"] - admitted)
    # Admitted whole, all 3 train. Not necessarily from the first step: a worker that starts more than torch's
    # last call (2 s) after the others joins the next round (seen in CI with the kit's init container).
    assert (jobs.status("second").get("admission") or {}).get("workers") == 3, summary(jobs.status("second"))
    wait_for(second, START_TIMEOUT, "a step of the second job at world size 3",
             until=lambda p: p.first_after(done_at, 3))
    finished(jobs, second, "second", 12)


@pytest.mark.slow
def test_a_higher_priority_job_preempts_and_the_preempted_one_resumes_uncharged(kueue_operator, jobs,
                                                                               queues: Queues, trainings,
                                                                               record_timing):
    queues.make(cpu=QUOTA_CPU)
    low_class, high_class = queues.priority("low", 10), queues.priority("high", 1000)
    low, high = trainings("low"), trainings("high")
    steps = 60
    jobs.create(kueue_job(jobs, "low", steps=steps, priority=low_class))
    before = wait_for(low, START_TIMEOUT, "the low-priority job at step 12 with 3 workers",
                      until=lambda p: any(r["step"] >= 12 and r["world_size"] == 3 for r in p.records))

    preempt = time.time()
    jobs.create(kueue_job(jobs, "high", steps=12, priority=high_class))
    status = jobs.wait_phase("Queued", 60, name="low")
    assert (status["reason"], status["admission"]["state"]) == ("Preempted", "Preempted"), summary(status)
    record_timing("preemptor created -> preempted job Queued", time.time() - preempt)
    stopped = low()
    assert jobs.status("low")["restarts"] == 0
    high_step = first_step_at(high, preempt, START_TIMEOUT, "the preemptor's first step")
    record_timing("preemptor created -> its first training step", high_step["time"] - preempt)
    finished(jobs, high, "high", 12)
    high_done = time.time()

    resumed = first_step_at(low, high_done, START_TIMEOUT, "the preempted job training again")
    record_timing("preemptor finished -> preempted job's next step", resumed["time"] - high_done)
    assert resumed["resumed_from"] >= stopped.last_step - CHECKPOINT_EVERY, (
        f"resumed from step {resumed['resumed_from']}, step {stopped.last_step} had been reached")
    assert stopped.last_step > before.last_step - 1
    done = finished(jobs, low, "low", steps)
    assert jobs.status("low")["restarts"] == 0 and not jobs.status("low").get("lastFailures")
    reasons = [e.reason for e in jobs.core.list_namespaced_event(
        jobs.namespace, field_selector="involvedObject.name=low").items]
    assert reasons.count("Preempted") == 1 and reasons.count("Admitted") == 2, reasons
    assert 3 in done.world_sizes()


# Workers of 500m, so that 5 and 2 stores fit the local cluster's nodes: the blocker (0.6) and 3 of grow's (1.6)
# fit in 2.2, 4 of grow's (2.1) beside the blocker do not.
SLICE_QUOTA_CPU = "2.2"


def half_cpu(manifest: dict, minimum: int, maximum: int, replicas: int) -> dict:
    manifest["spec"].update(minReplicas=minimum, maxReplicas=maximum, replicas=replicas)
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m"}}
    return manifest


def test_a_training_job_grows_through_a_workload_slice_once_kueue_admits_it(kueue_operator, jobs, queues: Queues,
                                                                          trainings, record_timing):
    queues.make(cpu=SLICE_QUOTA_CPU)  # the blocker (1 worker) and 3 of grow's fit, not 4
    with QuotaWatch(jobs.core, jobs.namespace, SLICE_QUOTA_CPU) as quota:
        blocker = half_cpu(kueue_job(jobs, "blocker", steps=2000), 1, 1, 1)
        jobs.create(blocker)
        grow, training = half_cpu(kueue_job(jobs, "grow", steps=2000), 1, 4, 2), trainings("grow")
        created = time.time()
        jobs.create(grow)
        first_step_at(training, created, START_TIMEOUT, "grow's first step at world size 2")
        wait_for(training, START_TIMEOUT, "grow at world size 2", until=lambda p: p.first_after(created, 2))

        scaled = time.time()
        jobs.scale(4, name="grow")
        waiting = wait_for(lambda: jobs.status("grow"), 60, "grow to say its slice waits for quota",
                           until=lambda s: "insufficient unused quota" in ((s.get("admission") or {}).get("message")
                                                                           or ""))
        assert waiting["admission"]["requested"] == 4 and waiting["phase"] == "Running", summary(waiting)
        pods_before = {p.metadata.uid for p in jobs.live_workers("grow")}
        seen = wait_for(training, 30, "grow training on at world size 2 while its slice waits",
                        until=lambda p: len([r for r in p.after(scaled) if r["world_size"] == 2]) >= 10)
        assert {r["world_size"] for r in seen.after(scaled)} == {2}, "the running world was stopped for a slice"
        assert len({r["restart_count"] for r in seen.records}) == 1 and len(pods_before) == 2

        freed = time.time()
        jobs.delete("blocker")
        grown = wait_for(training, START_TIMEOUT, "grow at world size 4",
                         until=lambda p: p.first_after(freed, 4)).first_after(freed, 4)
        record_timing("quota freed -> first step at world size 4 (slice admitted)", grown["time"] - freed)
        status = jobs.status("grow")
        assert status["admission"]["workers"] == 4 and not status["admission"].get("requested"), summary(status)
        assert pods_before <= {p.metadata.uid for p in jobs.live_workers("grow")}
    assert quota.worst <= quota.quota, f"pods asked for {quota.worst} cpu, quota {SLICE_QUOTA_CPU}"
