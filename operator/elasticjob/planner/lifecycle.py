"""The recipe of one reconcile: from a job and what was observed, the next status and the actions that get
there, in numbered steps (as Kueue's ReconcileGenericJob numbers its own). Pure.

Level-based: every call recomputes from the whole observed state, whatever woke the operator, and every
action is idempotent (deterministic names; the controller treats 'already exists' / 'already gone' as done).
Each step's policy lives in its own module: the phase in phase.py, runPolicy (deadline, suspend, TTL) in
run_policy.py, failures in failures.py, the rendezvous in rendezvous.py and recovery.py, the pods in scaling.py.
The integrations (Kueue, gangs) come in Observed.integrations and are called through base.Integration: gate,
ready_for_workers, finish; which ones there are is elasticjob/integrations.py's to say, not this module's.
"""

from __future__ import annotations

from datetime import datetime

from elasticjob import builders, naming, torchrun
from elasticjob.domain import JobRef, Settings
from elasticjob.models import ElasticJobStatus, Phase
from elasticjob.planner import capacity, ledger, links, nodes, ownership, peers, planned_stop, spares, stragglers
from elasticjob.planner.base import (
    UNGATED,
    Allowance,
    CreateObject,
    DefaultReplicas,
    Job,
    Observed,
    Plan,
    enter_phase,
    stamp,
)
from elasticjob.planner.failures import account_failures, account_round_failures
from elasticjob.planner.leftovers import collect_leftovers
from elasticjob.planner.phase import complete, count_workers, derive_running_phase, show_refusal
from elasticjob.planner.recovery import control_endpoint, drive_rendezvous, show_warm_starts
from elasticjob.planner.rendezvous import ensure_rendezvous, report_round
from elasticjob.planner.reopen import reopen_closed
from elasticjob.planner.run_policy import deadline_passed, finish, suspend
from elasticjob.planner.scaling import force_delete_stuck, scale


def plan(job: Job, observed: Observed, now: datetime, settings: Settings | None = None, token: str = "") -> Plan:
    # 1. Start from the stored status, stamped with what this reconcile saw.
    status = job.status.model_copy(deep=True)
    status.observed_generation = job.generation
    status.selector = naming.worker_selector(job.ref.name)
    status.rendezvous.run_id = job.ref.uid
    ownership.begin(status)
    ownership.record_seen(status, observed.pods)
    result = Plan(status=status)
    ownership.rename_taken(result, job.ref.name, observed.squatted)
    # 2. Count, report the store's round, and remove what earlier generations left.
    count_workers(result, observed.by_state, spares.spare_ips(observed))
    report_round(result, observed)
    collect_leftovers(result, job, observed, now)
    settings = settings or Settings()
    # 3. A job still going is admitted, then driven; 4. a finished one is cleaned up (runPolicy) and the
    # integrations release what they hold.
    allowed = gate(result, job, observed, settings, now) if not status.phase.finished else None
    # The workers wanted now: the spec's count, capped by what the integrations allow. Decided and written here only.
    allowance = allowed or UNGATED
    status.desired_replicas = allowance.replicas(job.ref.spec.desired_replicas)
    status.desired_spares = allowance.replicas(job.ref.spec.desired_pods) - status.desired_replicas  # spares last
    if allowed is not None:
        drive(result, job, observed, allowed, settings, token, now)
    if status.phase.finished:
        finish(result, job, observed, now)
        for integration in observed.integrations:
            integration.finish(result, job, observed, settings, now)
    # 4.5 With --taint-bad-nodes, the nodes the job avoids for their own sake are tainted for every pod.
    nodes.taint(result, job, settings, now)
    # 5. The downtime ledger: what this reconcile booked opens an incident, what it saw advances or closes one.
    ledger.track(result, job, observed, now)
    capacity.track(result, observed, now)
    return result


def gate(plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> Allowance | None:
    """3.1-3.2: what the job may run now, or None while it must not run (invalid, held by an integration,
    suspended, past its deadline)."""
    spec = job.ref.spec
    # 3.1 What the schema cannot check fails the job at once.
    problems = validate(job.ref)
    if problems:
        enter_phase(plan, job, Phase.FAILED, "InvalidSpec", "; ".join(problems), now)
        return None
    if spec.replicas is None:
        plan.act(DefaultReplicas(spec.max_replicas))
    # 3.2 Admission: held while an integration says so (queued in Kueue, or being suspended or resumed for
    # it), stopped while suspended, failed past its deadline.
    allowed = UNGATED
    for integration in observed.integrations:
        allows = integration.gate(plan, job, observed, settings, now)
        if allows is None:
            return None
        allowed = allowed.merge(allows)
    if spec.run_policy.suspend:
        suspend(plan, job, observed, now)
        return None
    if plan.status.start_time is None:
        plan.status.start_time = stamp(now)
    if deadline_passed(plan, job, now):
        return None
    return allowed


def drive(plan: Plan, job: Job, observed: Observed, allowed: Allowance, settings: Settings, token: str,
          now: datetime) -> None:
    """3.3-3.7: the store, failures, success, the workers and the phase of a job admitted to run."""
    # 3.3 The store: its pod, Service and endpoint, before any worker needs them.
    force_delete_stuck(plan, observed, now)
    show_warm_starts(plan, job, settings.kit_image, now)
    ensure_rendezvous(plan, job, observed, settings, token, now, allowed.store)
    peers.tell_store(plan, job, observed)  # the store answers the job's pods alone, nudges or not
    spares.tell_store(plan, job, observed, control_endpoint(observed, job))  # its seats, with spares
    # 3.4 Failures: charged once per incident; the rendezvous driven on the operator's evidence.
    # A worker that exits 0 finished the training, unless a planned stop is under way (planned_stop.py; one a
    # worker's agent asked on SIGTERM is taken as the operator's).
    planned_stop.adopt(plan, job, observed, spares.pods_wanted(plan), now)
    nodes.expire(plan, job, now)
    training_done = observed.by_state.finished and not planned_stop.stopping(plan)
    account_failures(plan, job, observed, training_done, now)
    if not training_done and not plan.status.phase.finished:
        account_round_failures(plan, job, observed, now)
        if settings.nudges:
            reopen_closed(plan, job, observed)  # a closure the job did not make
            drive_rendezvous(plan, job, observed, now)
            count_workers(plan, observed.by_state, spares.spare_ips(observed))  # READY: not those taken out
    if plan.status.phase.finished:
        plan.actions = [a for a in plan.actions if not isinstance(a, CreateObject)]
        return
    # 3.5 Success once a worker exited 0 and no other runs.
    if training_done:
        complete(plan, job, observed.by_state, now, spares.remove_at_end(observed))
        return
    # 3.6 The workers: as many as wanted and allowed (status.desiredReplicas), placed as the integrations say,
    # made once every integration is ready for them (the gang's group first).
    desired = spares.pods_wanted(plan)  # the workers and the warm spares: pods alike, the store seats them
    planned_stop.settle(plan, job, observed, desired, now)
    stragglers.replace_stragglers(plan, job, observed, now)  # a worker slower than the others goes
    links.replace_slow_link(plan, job, observed, now)  # so does one whose every link the round's probe found slow
    ready = all([i.ready_for_workers(plan, job, observed) for i in observed.integrations])
    placement = allowed.worker.merge(nodes.placement(plan.status))
    scale(plan, job, observed, desired, now, placement, create=ready, token=token,
          kit_image=settings.kit_image, pull_secrets=settings.image_pull_secrets,
          surplus=spares.surplus_seated(plan, observed))
    # 3.7 The phase they add up to, and a refusal kept on the job until a create succeeds.
    derive_running_phase(plan, job, observed.by_state, now, observed.store_pod, allowed.note)
    show_refusal(plan, job, observed, now)


def reject(job: Job, status: ElasticJobStatus, message: str, now: datetime) -> Plan:
    """The API server refused an object built from the spec: the spec is invalid."""
    result = Plan(status=status.model_copy(deep=True))
    enter_phase(result, job, Phase.FAILED, "InvalidSpec", message, now)
    return result


def validate(ref: JobRef) -> list[str]:
    """What the schema cannot check. Each message says what to fix."""
    container = builders.worker_container(ref.spec.template)
    if container is None:
        return ["template.spec.containers is empty: add the worker container that runs torchrun"]
    name = container.get("name", "?")
    problems = []
    if not container.get("image"):
        problems.append(f"container {name!r} has no image")
    if not container.get("command") and not container.get("args"):
        problems.append(f"container {name!r} has no command: set command: [torchrun, train.py, ...]")
    reserved = sorted({e.get("name") for e in container.get("env") or []} & torchrun.RESERVED_ENV)
    if reserved:
        problems.append(f"container {name!r} sets {', '.join(reserved)}, which the operator or torchrun "
                        f"sets itself: remove them")
    gpus = torchrun.requested_gpus(container)
    nproc = ref.spec.nproc_per_node
    if isinstance(nproc, int) and gpus and nproc > gpus:
        problems.append(f"nprocPerNode {nproc} exceeds the {gpus} GPUs container {name!r} requests: "
                        f"use nprocPerNode: auto or request more GPUs")
    return problems


