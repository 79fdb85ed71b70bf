"""Failures: each failed pod and each in-place restart counted once, and what it costs the restart budget. Pure.

The operator alone enforces maxRestarts. torchrun spends its own budget on membership changes too (a peer
that leaves breaks the survivors' collective, which torch counts as a failure), so agents get a budget they
never reach, and the operator charges:
- a worker pod that failed (not an eviction, preemption, lost node or lost store, nor NOT_THE_TRAINING's: an
  expired hold after a planned stop, an agent its rendezvous ended), once per incident;
- a round that the same nodes re-formed (torchrun restarted its workers in place after a failure), as the
  store reports it, once a worker's agent logged the failure behind it. Rounds in which nodes joined or left
  are membership changes and cost nothing, and so does the first such round after a pod ended: its
  replacement came back under the same address.
The store runs in the tenant's image and anyone who reaches its port can write torch's state: a round it
reports is a hint. It is charged only on a failure the operator saw itself (an agent's exit line, read from
the log of an admitted pod since the last read); without one it is recorded as Unconfirmed and costs nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.agent_messages import STOP_EXPIRED_EXIT
from elasticjob.models import MAX_FAILURES_KEPT, ElasticJobStatus, FailureRecord, Phase
from elasticjob.observe import PodView
from elasticjob.planner import nodes
from elasticjob.planner.base import DeletePod, Job, Observed, Plan, RoundFailure, enter_phase, since, stamp

# Failures this close together are one incident: agents of one group tend to fail together.
INCIDENT_WINDOW = timedelta(seconds=15)
# What the cluster did to a pod rather than the workload: never charged unless
# failurePolicy.countInfrastructureFailures (the planner, the metrics and docs/behaviour.md's failure table use
# this one list).
INFRASTRUCTURE_REASONS = ("Evicted", "Preempted", "NodeLost", "Partitioned", "NodeCheckFailed")
# A group re-forms this long at most after a pod of it ended: its replacement is scheduled, imports torch, joins.
REFORM_WINDOW = timedelta(seconds=60)
# In-place restarts charged for one answer of the store, whatever it reports (see account_round_failures).
MAX_ROUNDS_PER_ANSWER = 1
# A failure round the store reported without a failure the operator saw: recorded, never charged.
UNCONFIRMED = "Unconfirmed"
# How long a failure that claims a lost store waits for the operator's own evidence of it.
STORE_EVIDENCE_WAIT = timedelta(seconds=5)
# Charged failures that say nothing of the node they ran on: the job itself ended them (its fatal codes, its
# memory limit, torchrun's own budget). Every other charged failure makes the job avoid the node (nodes.py).
NOT_THE_NODE = ("FatalExitCode", "MaxRestartsExceeded", "OOMKilled")
# Failures that are neither the training's doing nor the cluster's nor the node's: never charged (whatever
# countInfrastructureFailures says), no node avoided, booked and shown. A rank held after a planned stop that nobody
# ended left with STOP_EXPIRED_EXIT (a stop written by someone who reached the store, or the operator's own left
# unfinished); the kit's agent left because of its rendezvous (closed, its state refused, no store, no round in
# time) with no worker of it failed (agent_messages.RENDEZVOUS_EXIT).
STOP_EXPIRED = "StopExpired"
RENDEZVOUS_FAILED = "RendezvousFailed"
NOT_THE_TRAINING = (STOP_EXPIRED, RENDEZVOUS_FAILED)


def classify(pod: PodView, job: Job, status: ElasticJobStatus, now: datetime,
             store: PodView | None = None) -> tuple[str, bool]:
    """(reason, charged to the restart budget) of a worker pod that ended badly. Whether its store was lost is
    decided on the operator's own evidence, never on what the pod's log says (the workload writes it too)."""
    policy = job.ref.spec.failure_policy
    if pod.disruption:
        return pod.disruption, policy.count_infrastructure_failures
    if pod.node_check_failed is not None:  # the kit's check of its node, before its agent joined: the node's fault
        return "NodeCheckFailed", policy.count_infrastructure_failures
    if rendezvous_just_lost(pod, status, now) or store_restarted_near(pod, store, now):
        return "RendezvousLost", False
    if pod.rendezvous_failed is not None:  # the kit's agent: its rendezvous ended it, no worker of it failed
        return RENDEZVOUS_FAILED, False
    if pod.stop_expired:  # the code is the progress API's own, not the training's: before its fatal codes
        return STOP_EXPIRED, False
    if pod.worker_exit_code in policy.fatal_exit_codes:
        return "FatalExitCode", True
    if pod.agent_gave_up:
        return "MaxRestartsExceeded", True
    if pod.exit_code is not None and pod.exit_code >= 128:
        return "Killed", True
    return pod.reason or "Error", True


def rendezvous_just_lost(pod: PodView, status: ElasticJobStatus, now: datetime) -> bool:
    """Agents exit about a second after their store goes away; failures that close to it are its doing."""
    lost = since(status.rendezvous.last_lost_time, pod.finished_at or now)
    return lost is not None and -INCIDENT_WINDOW <= lost <= INCIDENT_WINDOW


def awaiting_store_evidence(plan: Plan, pod: PodView, observed: Observed, now: datetime) -> bool:
    """A pod that says it lost its store, while the operator has seen no loss yet: its failure can be seen before
    the store's, so it is counted a little later, on whatever the operator has seen by then."""
    if not pod.says_store_lost or rendezvous_just_lost(pod, plan.status, now):
        return False
    if store_restarted_near(pod, observed.store_pod, now):
        return False
    waited = now - (pod.finished_at or now)
    if waited >= STORE_EVIDENCE_WAIT:
        return False
    plan.soon((STORE_EVIDENCE_WAIT - waited).total_seconds())
    return True


def store_restarted_near(pod: PodView, store: PodView | None, now: datetime) -> bool:
    """The kubelet restarted the store's container around the pod's end: a blip too short for the operator to
    have seen it stop serving, which its agents still lost their store to."""
    if store is None or store.restarted_at is None:
        return False
    gap = (pod.finished_at or now) - store.restarted_at
    return -INCIDENT_WINDOW <= gap <= INCIDENT_WINDOW


def same_incident(generation: int | None, status: ElasticJobStatus, when: datetime) -> bool:
    """A pod that predates the last restart and failed right around it went down with that restart;
    a replacement started after it, or a failure long after it, is a new restart."""
    if generation is not None and generation >= status.restarts:
        return False
    last = since(status.last_restart_time, when)
    return last is not None and abs(last) <= INCIDENT_WINDOW


def describe(pod: PodView) -> str:
    code = f"exit code {pod.worker_exit_code}" if pod.worker_exit_code is not None else "no exit code"
    where = f" on node {pod.node}" if pod.node else ""
    return f"pod {pod.name} (replica {pod.index}){where}: {code}, {pod.reason or pod.phase}"


# --- failed pods ------------------------------------------------------------------------------------------


def account_failures(plan: Plan, job: Job, observed: Observed, training_done: bool, now: datetime) -> None:
    """Count each failed pod once (by uid, remembered while the pod exists), then delete it to make room for
    its replacement."""
    status = plan.status
    counted = set(status.counted_failures)
    known = counted | {f.uid for f in status.last_failures}
    for pod in observed.by_state.failed:
        if pod.uid not in known and awaiting_store_evidence(plan, pod, observed, now):
            continue
        if pod.uid not in known and not status.phase.finished:
            counted.add(pod.uid)
            if training_done:
                # An agent exits 0 only when its workers succeeded: training is done, a straggler's exit is not.
                record_failure(plan, job, pod, pod.reason or "Error", False, now, "training had already finished")
            else:
                reason, charged = classify(pod, job, status, now, observed.store_pod)
                record_pod_failure(plan, job, pod, reason, charged, now)
        if pod.phase == "Failed" and not pod.deleting:
            plan.act(DeletePod(pod.name, pod.uid, grace_seconds=0))
    present = {p.uid for p in observed.pods}
    status.counted_failures = sorted(uid for uid in counted if uid in present)


def record_pod_failure(plan: Plan, job: Job, pod: PodView, reason: str, charged: bool, now: datetime) -> None:
    """A failed pod, charged or not as classified; a charged one on a node the job avoids already is part of the
    incident that made it avoid the node, and one on another node makes the job avoid that one."""
    finished = pod.finished_at or now
    if charged and nodes.already_avoided(plan.status, pod.node, finished):
        record_failure(plan, job, pod, reason, False, now, f"node {pod.node} is avoided already: one incident "
                       f"with the failure that made the job avoid it, not charged to maxRestarts")
        return
    if reason == "NodeCheckFailed":
        why = (f"its node check failed ({pod.node_check_failed}); not charged to maxRestarts unless "
               f"failurePolicy.countInfrastructureFailures")
        record_failure(plan, job, pod, reason, charged, now, why)
        nodes.avoid(plan, job, pod.node, reason, f"{describe(pod)}: {pod.node_check_failed}", finished)
        return
    if reason in NOT_THE_TRAINING:
        record_failure(plan, job, pod, reason, False, now, not_the_training(reason, pod.rendezvous_failed))
        return
    record_failure(plan, job, pod, reason, charged, now)
    if charged and reason not in NOT_THE_NODE and pod.reason not in NOT_THE_NODE:
        nodes.avoid(plan, job, pod.node, nodes.WORKER_FAILED, describe(pod), finished)


def not_the_training(reason: str, error: str | None = None) -> str:
    """Why a failure of NOT_THE_TRAINING costs nothing, in words."""
    if reason == RENDEZVOUS_FAILED:
        return (f"its agent left on the rendezvous' {error}, with no worker of it failed (a closed round, a state "
                f"refused, no store, or no round in time): not the training's doing, not charged to maxRestarts")
    return (f"a rank held after a planned stop that nobody ended and left with exit code {STOP_EXPIRED_EXIT} (a stop "
            f"not written by the operator, or one left unfinished): not the training's doing, not charged to "
            f"maxRestarts")


def record_failure(plan: Plan, job: Job, pod: PodView, reason: str, charged: bool, now: datetime,
                   why_uncharged: str = "not charged to maxRestarts") -> None:
    finished = pod.finished_at or now
    text = describe(pod)
    restarts = 0 if same_incident(pod.generation, plan.status, finished) else 1
    book(plan, job, FailureRecord(
        pod=pod.name, uid=pod.uid, replica_index=pod.index, exit_code=pod.worker_exit_code, reason=reason,
        message=pod.message[-1024:], charged=charged, time=stamp(finished)), finished, text, now, restarts)
    if not charged:
        plan.warn(reason, f"{text}; {why_uncharged}")


def book(plan: Plan, job: Job, record: FailureRecord, when: datetime, text: str, now: datetime,
         restarts: int = 1) -> None:
    """The one writer of a job's failures and its restart budget (a failed pod, an in-place restart the store
    saw, a partitioned agent all come here): remembers `record`; a fatal exit code or torchrun's own budget used
    up fails the job; a charged failure costs `restarts` group restarts (0 when it belongs to an incident already
    charged); an uncharged one that was the cluster's doing counts as an infrastructure failure."""
    status = plan.status
    remember(status, record)
    if record.reason == "FatalExitCode":
        enter_phase(plan, job, Phase.FAILED, "FatalExitCode",
                    f"{text}; {record.exit_code} is in failurePolicy.fatalExitCodes", now)
    elif record.reason == "MaxRestartsExceeded":
        status.restarts = max(status.restarts, job.ref.spec.max_restarts)
        enter_phase(plan, job, Phase.FAILED, "MaxRestartsExceeded", f"torchrun used up its restart budget; "
                    f"last failure: {text}", now)
    elif record.charged:
        charge(plan, job, restarts, when, text, now)
    elif record.reason in INFRASTRUCTURE_REASONS:
        status.infrastructure_failures += 1


def remember(status: ElasticJobStatus, record: FailureRecord) -> None:
    status.last_failures = (status.last_failures + [record])[-MAX_FAILURES_KEPT:]


def charge(plan: Plan, job: Job, restarts: int, when: datetime, text: str, now: datetime) -> None:
    """Restarts against the budget; the job fails once they exceed it."""
    status, limit = plan.status, job.ref.spec.max_restarts
    if restarts:
        status.restarts += restarts
        status.last_restart_time = stamp(when)
    if status.restarts > limit:
        enter_phase(plan, job, Phase.FAILED, "MaxRestartsExceeded",
                    f"{status.restarts} restarts exceed maxRestarts={limit}; last failure: {text}", now)
    else:
        plan.warn("WorkerFailed", f"{text}; restarting the group (restart {status.restarts} of {limit})")


# --- restarts torchrun made in place ----------------------------------------------------------------------


def account_round_failures(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    """Charge each round the store saw re-formed by the same nodes, once (counted per store process), when the
    operator saw the failure behind it; otherwise record it, uncharged."""
    store, seen = observed.store, plan.status.rendezvous
    if store is None:
        return
    if store.epoch != seen.epoch:
        seen.epoch, seen.failure_rounds = store.epoch, 0
    reported = store.failure_rounds - seen.failure_rounds
    if reported <= 0:
        return
    if observed.round_failures_wait > 0:
        plan.soon(observed.round_failures_wait)  # the agents' logs are read at most so often: counted then
        return
    seen.failure_rounds = store.failure_rounds
    # The store answers a long-poll at each round: more than one new round in one answer is a reply to distrust
    # (a store that is not the job's, or a broken one), not a reason to fail the job at once.
    new = min(reported, MAX_ROUNDS_PER_ANSWER)
    when = round_time(store.last_failure_round_at, now)
    cause = root_cause(observed.round_failures, job.ref.spec.failure_policy.fatal_exit_codes)
    lost = lost_pod_before(plan.status, when)
    uid = f"{store.epoch}/{store.failure_rounds}"
    if cause is None and lost is None:
        unconfirmed(plan, job, uid, reported, when, now)
        return
    if stop_expired(observed.round_failures):
        text = f"{round_text(cause, 1)}; {not_the_training(STOP_EXPIRED)}"
        book(plan, job, FailureRecord(pod=cause.pod if cause else "", uid=uid, exit_code=STOP_EXPIRED_EXIT,
                                      reason=STOP_EXPIRED, message=text[-1024:], charged=False, time=stamp(when)),
             when, text, now, 0)
        plan.warn(STOP_EXPIRED, text)
        return
    failed = nodes.blamed(observed.round_failures, cause, observed.workers)
    if failed is not None and nodes.already_avoided(plan.status, failed.node, when):
        on_avoided_node(plan, job, failed, uid, cause, when, now)
        return
    text = round_text(cause, new)
    if reported > new:
        text = f"{text}; the store reported {reported} new rounds at once, {new} charged"
    if lost is not None:
        text = f"{text}; the first is the group re-forming after pod {lost.pod} ended, already counted"
    charged = new - (lost is not None)
    blame = failed is not None and lost is None and not fatal(cause, job) and nodes.avoid_seconds(job) > 0
    if blame and charged and follows_an_unplaced_restart(plan.status, when):
        # The node is found the round after the one charged (whose failure every pod logged): one incident.
        charged = 0
        text = f"{text}; the same incident as the restart charged at {plan.status.last_restart_time}"
    # Each is a restart of its own: a worker that fails at every start must use up the budget.
    book(plan, job, FailureRecord(
        pod=cause.pod if cause else "", uid=uid, exit_code=cause.exit_code
        if cause else None, reason="FatalExitCode" if fatal(cause, job) else "Error", message=text[-1024:],
        charged=charged > 0, time=stamp(when)), when, text, now, charged)
    if blame and failed is not None:
        nodes.avoid(plan, job, failed.node, nodes.WORKER_FAILED, f"pod {failed.name}: {text}", when)


def follows_an_unplaced_restart(status: ElasticJobStatus, when: datetime) -> bool:
    """The last charged failure is an in-place restart, at most INCIDENT_WINDOW before `when`, that no node was
    blamed for (no avoidance began since): the failure now laid on a node is the same incident. Once a node is
    blamed the next failure elsewhere is charged again, so a script that fails wherever it runs still uses up the
    budget."""
    last = next((f for f in reversed(status.last_failures) if f.charged), None)
    gap = since(last.time, when) if last is not None else None
    if last is None or not is_round_record(last) or gap is None or not timedelta(0) <= gap <= INCIDENT_WINDOW:
        return False
    return not any((began := since(e.since, when)) is not None and began <= gap for e in status.avoided_nodes)


def on_avoided_node(plan: Plan, job: Job, pod: PodView, uid: str, cause: RoundFailure | None, when: datetime,
                    now: datetime) -> None:
    """An in-place restart whose failure was on a node the job avoids already: the node stays bad, so the pod
    goes (its replacement lands elsewhere) and the restart is part of the incident that made the job avoid the
    node. A fatal exit code still fails the job."""
    text = f"{round_text(cause, 1)}, on node {pod.node}, which the job avoids already: one incident with the " \
           f"failure that made it avoid the node, not charged to maxRestarts"
    book(plan, job, FailureRecord(
        pod=pod.name, uid=uid, replica_index=pod.index, exit_code=cause.exit_code if cause else None,
        reason="FatalExitCode" if fatal(cause, job) else "Error", message=text[-1024:],
        charged=fatal(cause, job), time=stamp(when)), when, text, now, 0)
    if not plan.status.phase.finished:
        nodes.move_off(plan, pod, f"its workers failed again ({cause.exit_code if cause else 'no exit code'})")


def round_time(reported: datetime | None, now: datetime) -> datetime:
    """When the store says the round failed, if that is within the last minute by the operator's clock; else
    now (the store's clock is the tenant's word)."""
    if reported is None or not timedelta(0) <= now - reported <= REFORM_WINDOW:
        return now
    return reported


def unconfirmed(plan: Plan, job: Job, uid: str, reported: int, when: datetime, now: datetime) -> None:
    """A failure round with nothing behind it that the operator saw: shown, never charged, never failing the job."""
    text = (f"the store reported {reported} new failure round(s) (a worker failed and torchrun restarted the "
            f"group in place), with no failure the operator saw: no worker pod ended and no agent logged one; "
            f"not charged to maxRestarts")
    book(plan, job, FailureRecord(pod="", uid=uid, reason=UNCONFIRMED, message=text, charged=False,
                                  time=stamp(when)), when, text, now)
    plan.warn("UnconfirmedFailureRound", text)


def lost_pod_before(status: ElasticJobStatus, when: datetime) -> FailureRecord | None:
    """The pod failure, if the last thing remembered is one, that this re-formed round belongs to.

    A replacement pod can come back with its predecessor's address (its name, an IP handed out again), so the
    store sees the same nodes re-form the round and reports a failure round: but that pod's failure was
    already counted (or deliberately not, for an eviction). A second round, or one long after, is new."""
    last = status.last_failures[-1] if status.last_failures else None
    if last is None or is_round_record(last):
        return None
    gap = since(last.time, when)
    return last if gap is not None and timedelta(0) <= gap <= REFORM_WINDOW else None


def is_round_record(record: FailureRecord) -> bool:
    return "/" in record.uid  # "<store epoch>/<failure round>"; pod uids never hold a slash


AGENT_SIGTERM = nodes.AGENT_SIGTERM


def stop_expired(failures: list[RoundFailure]) -> bool:
    """The workers that failed left with STOP_EXPIRED_EXIT (their holds after a planned stop ran out together),
    or were their own agents' SIGTERM after it; any other code is a failure of the training's, charged as ever."""
    codes = {f.exit_code for f in failures}
    return STOP_EXPIRED_EXIT in codes and codes <= {STOP_EXPIRED_EXIT, AGENT_SIGTERM}


def root_cause(failures: list[RoundFailure], fatal_codes: list[int]) -> RoundFailure | None:
    """A fatal code wherever it shows; else a worker killed by a signal (the kernel's OOM killer, a SIGKILL):
    its peers' collectives then fail and they exit 1, often logged first (seen on real nodes: rank 0 OOM-killed,
    and the failure blamed on the pod whose rank 1 lost its peer); else the first failure logged."""
    fatal = next((f for f in failures if f.exit_code in fatal_codes), None)
    killed = next((f for f in failures if f.exit_code < 0 and f.exit_code != AGENT_SIGTERM), None)
    return fatal or killed or (failures[0] if failures else None)


def fatal(cause: RoundFailure | None, job: Job) -> bool:
    return cause is not None and cause.exit_code in job.ref.spec.failure_policy.fatal_exit_codes


def round_text(cause: RoundFailure | None, rounds: int) -> str:
    what = "a worker failed and torchrun restarted the group in place"
    if rounds > 1:
        what = f"{rounds} times a worker failed and torchrun restarted the group in place"
    if cause is None:
        return what
    return f"{what}: pod {cause.pod}, exit code {cause.exit_code}"
