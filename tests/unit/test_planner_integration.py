"""The planner's side of the integration seam (planner.base.Integration): gates in order, their allowances merged,
the worker count decided once from them, workers made only once every integration is ready. An integration
written here, as the next one (JobSet, Volcano) would be, plugs in with no change to the planner."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from factory import NOW, SERVICE, creates, job, rdzv, running_status, worker

from elasticjob import planner
from elasticjob.domain import NO_PLACEMENT, Placement
from elasticjob.planner import UNGATED, Allowance

ZONE_A = Placement(node_selector=(("zone", "a"),))
GPU = Placement(tolerations=({"key": "gpu", "operator": "Exists"},), scheduler_name="batch")


@pytest.mark.parametrize("first, second, merged", [
    (UNGATED, UNGATED, UNGATED),
    (Allowance(workers=2), UNGATED, Allowance(workers=2)),
    (UNGATED, Allowance(workers=3), Allowance(workers=3)),
    (Allowance(workers=4), Allowance(workers=2), Allowance(workers=2)),
    (Allowance(worker=ZONE_A), Allowance(worker=GPU, store=GPU),
     Allowance(worker=ZONE_A.merge(GPU), store=NO_PLACEMENT.merge(GPU))),
])
def test_allowances_merge_to_the_lesser_count_and_both_placements(first, second, merged):
    assert first.merge(second) == merged


@pytest.mark.parametrize("allowed, wanted, replicas", [
    (None, 3, 3),
    (5, 3, 3),
    (3, 3, 3),
    (2, 3, 2),
    (0, 3, 0),
])
def test_the_replica_count_is_the_spec_capped_by_the_allowance(allowed, wanted, replicas):
    assert Allowance(workers=allowed).replicas(wanted) == replicas


@dataclass(frozen=True)
class Quota:
    """A test integration: holds the job, or allows `workers` placed in zone a; workers wait for `ready`."""

    workers: int | None = None
    hold: bool = False
    ready: bool = True
    finished: list[str] = field(default_factory=list)

    def gate(self, plan, job, observed, settings, now):
        if self.hold:
            plan.status.message = "held by the quota"
            return None
        return Allowance(workers=self.workers, worker=ZONE_A)

    def ready_for_workers(self, plan, job, observed):
        return self.ready

    def finish(self, plan, job, observed, settings, now):
        self.finished.append(job.ref.name)


def plan(j, pods, *integrations):
    return planner.plan(j, planner.Observed(pods=pods, service=SERVICE, integrations=integrations), NOW)


@pytest.mark.parametrize("gates, desired, made", [
    ((), 3, ["train-worker-0", "train-worker-1", "train-worker-2"]),
    ((Quota(),), 3, ["train-worker-0", "train-worker-1", "train-worker-2"]),
    ((Quota(workers=2),), 2, ["train-worker-0", "train-worker-1"]),
    ((Quota(workers=5), Quota(workers=1)), 1, ["train-worker-0"]),
])
def test_the_workers_are_as_many_as_every_gate_allows(gates, desired, made):
    result = plan(job(replicas=3), [rdzv()], *gates)
    assert result.status.desired_replicas == desired
    assert creates(result) == made


def test_a_gate_places_the_workers():
    result = plan(job(replicas=1), [rdzv()], Quota())
    (pod,) = [a.manifest for a in result.actions
              if isinstance(a, planner.CreateObject) and a.manifest["kind"] == "Pod" and "worker" in
              a.manifest["metadata"]["name"]]
    assert pod["spec"]["nodeSelector"] == {"zone": "a"}


def test_a_held_job_makes_nothing_and_wants_the_spec_count():
    result = plan(job(replicas=3), [], Quota(workers=1), Quota(hold=True))
    assert creates(result) == [] and not creates(result, "Service")
    assert result.status.desired_replicas == 3
    assert result.status.message == "held by the quota"


def test_workers_wait_for_every_integration_to_be_ready():
    result = plan(job(replicas=2), [rdzv()], Quota(), Quota(ready=False))
    assert creates(result) == []


def test_a_finished_job_is_finished_by_every_integration():
    done = job(running_status(), replicas=1)
    quotas = (Quota(), Quota())
    result = plan(done, [rdzv(), worker(0, phase="Succeeded", exit_code=0)], *quotas)
    assert result.status.phase.finished
    assert [q.finished for q in quotas] == [["train"], ["train"]]
