"""The downtime ledger against a scripted fault: rank 0's pod SIGKILLed while examples/train_ddp.py reports its
steps and checkpoints through elasticjob_progress. The incident the job's status shows must be the one the
training saw: Rank0Lost, every phase known, and its seconds lost matching the measured gap to the first step
after it plus the steps recomputed."""

from __future__ import annotations

import pytest

from e2e_support import Progress, job_manifest, train_args
from helpers import wait_for
from test_training import CHECKPOINT_EVERY, RECOVERY_TIMEOUT, recovery, start

STEP_SECONDS = 0.1
PHASES = ("detect", "replace", "rendezvous", "workerStart", "checkpointLoad", "recompute")


@pytest.mark.slow
def test_the_ledger_accounts_for_a_killed_rank0_pod(operator, jobs, progress, faults):
    manifest = job_manifest(jobs.namespace, train_args=train_args(400, step_seconds=STEP_SECONDS))
    before = start(jobs, progress, manifest, world_size=2, min_step=CHECKPOINT_EVERY + 3)
    victim = before.rank0_host()
    fault_time = faults.kill_pod(victim)
    before = Progress([r for r in progress().records if r["time"] <= fault_time])
    resumed = recovery(progress, fault_time, f"SIGKILL of {victim}")
    # The fault's incident; a restart the start-up made (an agent joining late: a Rejoin) may close beside it.
    ledger = wait_for(lambda: jobs.status().get("goodput") or {}, RECOVERY_TIMEOUT, "a Rank0Lost incident closed",
                      until=lambda g: any(i.get("kind") == "Rank0Lost" for i in g.get("lastIncidents") or []))
    incident = next(i for i in ledger["lastIncidents"] if i["kind"] == "Rank0Lost")
    assert incident["pod"] == victim, incident
    phases = incident["phases"]
    assert all(phases.get(name) is not None for name in PHASES), f"a phase unknown with the API on: {incident}"
    assert incident["lostSeconds"] == pytest.approx(sum(phases[name] for name in PHASES), abs=0.01)
    # Measured: the fault to the first step after it, plus the steps done again at the step time.
    redone = max(0, before.last_step - resumed["resumed_from"]) * STEP_SECONDS
    measured = resumed["time"] - fault_time + redone
    # The fault time comes from the API to the second (a container's finishedAt), the reports once a second.
    seen = (f"ledger {incident}; measured {measured:.2f} s: fault {fault_time:.2f}, first step after it "
            f"{resumed['time']:.2f} (step {resumed['step']}, resumed from {resumed['resumed_from']}), last step "
            f"before {before.last_step}")
    assert abs(incident["lostSeconds"] - measured) <= max(2.0, 0.25 * measured), seen
    assert 0 < ledger["goodputPercent"] < 100 and ledger["progressReported"], ledger
    events = [e.message for e in jobs.core.list_namespaced_event(jobs.namespace).items
              if e.reason == "IncidentClosed"]
    assert any(m.startswith(f"Rank0Lost (Killed, pod {victim}): ") for m in events), events
