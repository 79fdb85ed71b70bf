"""The job's downtime ledger (status.goodput): incidents opened from what this reconcile booked, advanced with
what the operator sees, closed once the training steps again, and the seconds lost per phase (goodput.py). Pure.

An incident opens on a failure booked (failures.py: a worker, rank 0, a node), an agent cut off for its silence
(recovery.py: a partition, whether its pod was stopped or left running; Plan.cut_off), the store lost
(rendezvous.py), a change of the desired workers, a suspension, a preemption by Kueue, or a round of the store that
no booked fault explains (a Rejoin: account_round, the rounds read by rejoin.py); a fault while one is open belongs
to it when it began before that one's training stepped again, and is the next incident when it began after
(open_next). It starts at the
operator's evidence of the fault, moved later to the training's last step where that is better evidence
(goodput.fault_start). Where the training stopped and saved at an agreed step first (planned_stop.py; on an eviction
or a drain, the worker's agent asks it: elasticjob_warm/evicted.py), no step is recomputed, and the incident of the
operator's stop starts when the training stopped. It closes at the training's first step after it
(elasticjob_progress), or, for a job that never reported a step, once every wanted worker runs and the store
reported the group re-formed. The training's reports are the tenant's word: they are shown here and decide nothing
else (but when a planned stop, which the tenant's own grace bounds, may end). A worker process that kept on stepping
through the fault (the store lost and back, its agents riding it out) lost nothing: the incident closes at 0 s (a
lost store once its agents resume their round on the one that came back, or re-form there: that restart is a
Rejoin).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.models import (
    MAX_INCIDENTS_KEPT,
    FailureRecord,
    GoodputStatus,
    Incident,
    LostPhases,
    Phase,
)
from elasticjob.observe import ProgressView, StoreView
from elasticjob.planner import goodput, planned_stop, spares
from elasticjob.planner.base import CutOff, Job, Observed, Plan, precise
from elasticjob.planner.failures import is_round_record
from elasticjob.planner.rejoin import parse, regrouped, rejoined, resumed_round, rode_out

# An incident still open after this long is closed with what was seen (a training that never steps again).
GIVE_UP = timedelta(minutes=10)
# Faults seen while an incident is open, kept until it closes (open_next): more than this at once are part of it.
MAX_QUEUED = 4
KINDS = {"NodeLost": "NodeLost", "Partitioned": "Partition", "Preempted": "Preemption",
         "RendezvousLost": "StoreLost"}
STOPS_EVERY_WORKER = ("Preemption", "Suspend")


def track(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    status = plan.status
    ledger = status.goodput
    if ledger is None:
        if status.phase != Phase.RUNNING:
            return
        ledger = status.goodput = GoodputStatus(since=precise(now))
    store = observed.store
    progress = store.progress if store is not None else None
    if progress is not None and progress.step is not None:
        ledger.progress_reported = True
    done = observed.by_state.finished
    for fault, in_place in faults(plan, job, progress, now, done):
        found = opened(fault, in_place, store, progress, now)
        if ledger.open_incident is None:
            ledger.open_incident = found
        elif len(ledger.queued_incidents) < MAX_QUEUED:
            ledger.queued_incidents.append(found)
    account_round(plan, ledger, store, progress, now)
    for queued in ledger.queued_incidents:
        advance(queued, plan, observed, now, job.ref.spec.node_check.enabled)
    leaving = planned_stop.leaving(observed, spares.pods_wanted(plan))
    while (incident := ledger.open_incident) is not None:
        stepping_on(incident, progress, leaving)
        saved_first(incident, plan, progress)
        advance(incident, plan, observed, now, job.ref.spec.node_check.enabled)
        end = resumed(incident, ledger, progress, now)
        if end is None and not status.phase.finished and now - (parse(incident.start_time) or now) <= GIVE_UP:
            return
        close(plan, ledger, incident, progress, now)
        open_next(ledger, end)


def open_next(ledger: GoodputStatus, end: datetime | None) -> None:
    """After an incident closed with the training stepping again at `end`: the first fault seen meanwhile that
    began at or after `end` is the next incident (the others queue behind it); one that began before is part of
    the one that closed, whose time covers it (a fenced pod's failure beside its cut-off, the pods of one lost
    node). Seen in CI: an agent joined, its Rejoin's new process stepped, and the store was killed 0.2 s later,
    before the operator saw that step: the store's loss was never booked. A job that finished, or an incident
    given up, leaves nothing to book."""
    queued, ledger.queued_incidents = ledger.queued_incidents, []
    later = [q for q in queued if end is not None and (parse(q.start_time) or end) >= end]
    if later:
        ledger.open_incident, ledger.queued_incidents = later[0], later[1:]


def faults(plan: Plan, job: Job, progress: ProgressView | None, now: datetime,
           done: bool = False) -> list[tuple[Incident, bool]]:
    """What this reconcile booked that costs training time, oldest first, each with whether it is a restart
    torchrun made in place that the store already reported re-formed. Once a worker exited 0 (`done`: its agent
    exits 0 only when the training succeeded) a failure costs none: a straggler still joining when the others
    closed the rendezvous was booked WorkerLost, 1.5 s, as the job succeeded."""
    old, new = job.status, plan.status
    # A fenced agent's failure (recovery.fence) is booked beside its cut-off, at detection: the cut-off, from
    # its last heartbeat, sorts first and is that fault's one incident.
    found = [(partitioned(cut, progress, now), False) for cut in plan.cut_off]
    # The store's loss is its own incident; a pod whose agent was taken out of the rendezvous already
    # (recovery.leave_pod: a lost node's, booked NodeLost later) cost the training nothing more when it went.
    skipped = {f.uid for f in old.last_failures} | set(old.rendezvous.left_out)
    for record in [] if done else new.last_failures:
        if record.uid not in skipped and record.reason != "RendezvousLost":
            found.append((from_failure(record, progress, now), is_round_record(record)))
    if new.rendezvous.last_lost_time and new.rendezvous.last_lost_time != old.rendezvous.last_lost_time:
        found.append((Incident(kind="StoreLost", reason="StoreLost", pod=new.rendezvous.pod,
                               start_time=new.rendezvous.last_lost_time), False))
    if old.desired_replicas and new.desired_replicas != old.desired_replicas:
        found.append((Incident(kind="ScaleChange", start_time=precise(now),
                               reason="ScaleUp" if new.desired_replicas > old.desired_replicas else "ScaleDown"),
                      False))
    if new.phase == Phase.SUSPENDED and old.phase != Phase.SUSPENDED:
        found.append((Incident(kind="Suspend", reason="Suspended", start_time=precise(now)), False))
    if plan.preempted:  # an integration took the quota back (Kueue: planner/base.Plan.preempted)
        found.append((Incident(kind="Preemption", reason=plan.preempted, start_time=precise(now)), False))
    return sorted(found, key=lambda found: parse(found[0].start_time) or now)


def account_round(plan: Plan, ledger: GoodputStatus, store: StoreView | None, progress: ProgressView | None,
                  now: datetime) -> None:
    """Opens a Rejoin for a round no incident explains, then notes the store's round as accounted for. A lost
    store that the training stepped through ends when its agents re-form on the store that came back: that
    restart is its own incident, from the training's last step (not from the store's loss)."""
    status = plan.status
    incident = ledger.open_incident
    if incident is not None and incident.kind == "StoreLost" and regrouped(ledger, store) \
            and (rode_out(status, incident) or stepped(incident, progress, now)):
        close(plan, ledger, incident, progress, now, stepped_through=True)
    pending = store is not None and store.epoch == status.rendezvous.epoch \
        and store.failure_rounds > status.rendezvous.failure_rounds  # in place, booked once the logs are read
    if ledger.open_incident is None and not pending and not resumed_round(status, ledger, store, progress) \
            and (joined := rejoined(ledger, store, progress, now)):
        ledger.open_incident = opened(joined, True, store, progress, now)
        # Nothing to detect or replace: the joining agent ran already. Its time is the group's re-forming.
        joined.detected_time = joined.replaced_time = joined.start_time
        if progress is not None and progress.started_at is not None \
                and (parse(joined.start_time) or now) < progress.started_at:
            joined.last_step = None  # the report is the new process's: the old one's last step is not known
    if store is not None and store.complete and store.round is not None:
        ledger.round, ledger.epoch = store.round, store.epoch


def stepped(incident: Incident, progress: ProgressView | None, now: datetime) -> bool:
    return progress is not None and kept_on(incident, progress, parse(incident.start_time) or now)


def stepping_on(incident: Incident, progress: ProgressView | None, leaving: bool = False) -> None:
    """A stop of every worker (a preemption, a suspension), or a scale-down whose pods are still `leaving`, that the
    training has not reached yet: it steps on until those pods go, so the time lost starts at its last step, not at
    the notice, and its steps since are not a training that stepped through the fault (that closed such an incident
    at 0 s: torchrun run as written, preempted, lost 52.6 s and booked none of it; a scale-down whose leaving agent
    asked the stop on SIGTERM, its saved step booked nowhere)."""
    scaling_down = incident.reason == "ScaleDown" and leaving
    if (incident.kind not in STOPS_EVERY_WORKER and not scaling_down) or progress is None or progress.step_at is None:
        return
    start = parse(incident.start_time)
    if start is not None and kept_on(incident, progress, start):
        incident.start_time, incident.last_step = precise(progress.step_at), progress.step


def saved_first(incident: Incident, plan: Plan, progress: ProgressView | None) -> None:
    """A planned stop (planned_stop.py) the training acknowledged: every rank saved its step, so none is done
    again, and the training ran until it did: the time lost starts there. A stop the operator did not ask for
    that every rank saved (a worker's agent asked it on SIGTERM: an eviction, a node drain;
    elasticjob_warm/evicted.py) recomputes none either; its time lost starts when the pod went."""
    stop = plan.status.planned_stop
    if incident.stopped_step is not None:
        return
    if stop is None and progress is not None and progress.stopped_step is not None:
        incident.stopped_step = incident.last_step = progress.stopped_step
        return
    if stop is None or stop.stopped_time is None or stop.step is None:
        return
    incident.stopped_step = incident.last_step = stop.step
    start, stopped = parse(incident.start_time), parse(stop.stopped_time)
    if start is not None and stopped is not None and stopped > start:
        incident.start_time = stop.stopped_time


def held_rank0(record: FailureRecord, progress: ProgressView | None) -> bool:
    """The failed pod held rank 0 when it failed: it reports the training's progress, or it did until a worker
    process started after the failure took over (the survivors restarted before the loss was booked: a kubelet
    that saw the container end a second or two late)."""
    if progress is None or not record.pod:
        return False
    if record.pod == progress.pod:
        return True
    failed = parse(record.time)
    return (record.pod == progress.previous_pod and failed is not None and progress.started_at is not None
            and progress.started_at >= failed)


def from_failure(record: FailureRecord, progress: ProgressView | None, now: datetime) -> Incident:
    """A failure booked: its start is the container's end (finishedAt, to the second) or, later within that
    second, the training's last step before it (goodput.fault_start says why)."""
    kind = KINDS.get(record.reason, "WorkerLost")
    if kind == "WorkerLost" and held_rank0(record, progress):
        kind = "Rank0Lost"
    start = record.time or precise(now)
    evidence = parse(start) or now
    if progress is not None:
        best = goodput.fault_start(evidence, coarseness(start), now, progress.started_at, progress.step_at)
        start = start if best == evidence else precise(best)
    return Incident(kind=kind, reason=record.reason, pod=record.pod or None, start_time=start)


def partitioned(cut: CutOff, progress: ProgressView | None, now: datetime) -> Incident:
    """An agent cut off for its silence (recovery.py), its pod fenced or left running: the training stopped at
    its last heartbeat at the earliest, or at its last step since, if it reported one (the survivors hang in a
    collective from the partition on; a partitioned rank 0's reports stop reaching the store there too)."""
    start = cut.last_heartbeat
    if progress is not None:
        start = goodput.fault_start(start, None, now, progress.started_at, progress.step_at)
    return Incident(kind="Partition", reason=cut.reason, pod=cut.pod, start_time=precise(start))


def coarseness(value: str) -> timedelta:
    """How much later than written a time can be: Kubernetes writes a container's finishedAt to the second."""
    return timedelta(0) if "." in value else timedelta(seconds=1)


def opened(incident: Incident, in_place: bool, store: StoreView | None, progress: ProgressView | None,
           now: datetime) -> Incident:
    start = parse(incident.start_time) or now
    incident.detected_time = precise(max(start, now))
    if store is not None:
        incident.round, incident.epoch = store.round, store.epoch
        if in_place and store.round:
            incident.round = store.round - 1  # the store reported the re-formed round: that is the mark
    if progress is not None:
        incident.last_step = goodput.step_at_fault(progress.step, progress.step_at, progress.step_seconds, start)
    return incident


def advance(incident: Incident, plan: Plan, observed: Observed, now: datetime, checking: bool = False) -> None:
    """The marks the operator sees: every wanted worker running, then the group re-formed in the store, and what
    the node check held that group's join (`checking`: the job's agents check their nodes)."""
    if incident.replaced_time is None:
        running = spares.seated(list(observed.by_state.running), observed)  # a spare waits, not trains
        if len(running) >= plan.status.desired_replicas > 0:
            incident.replaced_time = precise(now)
    store = observed.store
    if incident.round_time is None and incident.replaced_time is not None and store is not None \
            and store.complete and store.round is not None \
            and (store.epoch != incident.epoch or incident.round is None or store.round > incident.round):
        incident.round_time = precise(now)
    if incident.round_time is not None and incident.node_check_held is None:
        incident.node_check_held = node_check_held(store, checking, parse(incident.start_time) or now)


def node_check_held(store: StoreView | None, checking: bool, start: datetime) -> float | None:
    """The longest an agent of the latest round waited for its node check after the fault (0 for those that
    checked before it: they restarted in place), once every member has said; 0 where no agent checks."""
    if not checking:
        return 0.0
    members = (store.last_round_nodes or tuple(node.addr for node in store.participants)) if store else ()
    said = {check.addr: check for check in store.node_checks} if store else {}
    if not members or any(addr not in said for addr in members):
        return None
    return max((said[addr].held for addr in members if said[addr].at > start), default=0.0)


def resumed(incident: Incident, ledger: GoodputStatus, progress: ProgressView | None,
            now: datetime) -> datetime | None:
    """When the training stepped again after the incident: its new process's first step, or the moment a process
    that kept on stepping was seen past the fault; without any reports, the group re-formed."""
    start = parse(incident.start_time) or now
    if progress is not None and progress.step is not None:
        if progress.started_at is not None and progress.started_at > start and progress.first_step_at is not None:
            return progress.first_step_at
        if kept_on(incident, progress, start):
            return now
        return None
    if not ledger.progress_reported:
        return parse(incident.round_time)
    return None


def kept_on(incident: Incident, progress: ProgressView, start: datetime) -> bool:
    began = progress.started_at
    return began is not None and began <= start and progress.step_at is not None and progress.step_at > start \
        and progress.step is not None and progress.step > (incident.last_step or 0)


def close(plan: Plan, ledger: GoodputStatus, incident: Incident, progress: ProgressView | None,
          now: datetime, stepped_through: bool = False) -> None:
    start = parse(incident.start_time) or now
    if stepped_through or (progress is not None and kept_on(incident, progress, start)):
        incident.phases = LostPhases(**{name: 0.0 for name in goodput.PHASE_NAMES})
    else:
        incident.phases = goodput.phases(marks(incident, progress, start, now))
    incident.lost_seconds = goodput.lost(incident.phases)
    incident.end_time = precise(now)
    ledger.open_incident = None
    ledger.incidents += 1
    ledger.lost_seconds = round(ledger.lost_seconds + incident.lost_seconds, 3)
    since = parse(ledger.since) or start
    ledger.wall_seconds = round(max(0.0, (now - since).total_seconds()), 3)
    ledger.goodput_percent = goodput.ettr(ledger.wall_seconds, ledger.lost_seconds)
    ledger.last_incidents = (ledger.last_incidents + [incident])[-MAX_INCIDENTS_KEPT:]
    plan.normal("IncidentClosed", summary(incident))


def marks(incident: Incident, progress: ProgressView | None, start: datetime, now: datetime) -> goodput.Marks:
    fresh = progress if progress is not None and progress.started_at is not None \
        and progress.started_at > start else None
    return goodput.Marks(
        start=start, detected=parse(incident.detected_time) or now, replaced=parse(incident.replaced_time),
        round=parse(incident.round_time),
        loading=fresh.loading_at if fresh else None, loaded=fresh.loaded_at if fresh else None,
        first_step=fresh.first_step_at if fresh else None, loaded_step=fresh.loaded_step if fresh else None,
        last_step=incident.last_step, step_seconds=fresh.step_seconds if fresh else None,
        node_check=incident.node_check_held)


def summary(incident: Incident) -> str:
    """One line per closed incident, as `kubectl describe` lists it under Events: the kind, the seconds lost, each
    phase's share in the ledger's order (so the line adds up), the biggest named, and the phases not seen."""
    what = f"{incident.kind}" + (f" ({incident.reason}, pod {incident.pod})" if incident.pod else
                                 f" ({incident.reason})" if incident.reason else "")
    lost = incident.lost_seconds or 0.0
    line = f"{what}: {lost:.1f} s of training lost"
    seen = [(goodput.wire_name(name), value) for name in goodput.PHASE_NAMES
            if incident.phases is not None and (value := getattr(incident.phases, name)) is not None]
    unknown = [goodput.wire_name(name) for name in goodput.PHASE_NAMES
               if incident.phases is None or getattr(incident.phases, name) is None]
    if seen and lost == 0 and not unknown:
        return line + " (the training stepped on through it)"
    parts = [", ".join(f"{name} {value:.1f}" for name, value in seen)] if seen else []
    top = goodput.biggest(incident.phases) if incident.phases else None
    if top is not None and top[1] > 0:
        parts.append(f"most in {top[0]}")
    if unknown:
        parts.append(f"unknown: {', '.join(unknown)}")
    return line + (f" ({'; '.join(parts)})" if parts else "")
