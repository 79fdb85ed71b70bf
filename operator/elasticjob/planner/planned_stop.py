"""Planned stops: before the operator removes workers it chose to remove (a scale-down, runPolicy.suspend, Kueue's
preemption or eviction), the training stops after a step all ranks agree on and saves it; then the pods go. Pure.

Only a training that asks elasticjob_progress's should_stop() is asked (its progress report says it listens),
only through a store that takes the operator's nudges, and only within runPolicy.stopGraceSeconds: past it, or
with 0, the pods go as without it. The operator asks the store (protocol.Stop, named by the time it decided);
the store picks the step from the training's latest report (elasticjob_store/stop.py) and every rank reads it.
Each rank saves, says so and holds its process; rank 0 reports the stop once every rank did, and that report
lets the pods go. The report is the tenant's word, but it only ends a wait the tenant's own spec bounds.

torchrun restarts the whole group on a change of members, so a scale-down stops the whole group too: the
workers that stay are restarted (protocol.Restart) once those that go are gone, re-form and load the step
saved. While a stop is under way, a worker that exits 0 has not finished the training.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum

from elasticjob.models import PlannedStop
from elasticjob.observe import ProgressView, StoreView
from elasticjob.planner.base import Event, Job, Observed, Plan, StoreAction, precise
from elasticjob.planner.recovery import control_endpoint
from elasticjob_store.protocol import Restart, Stop

# Past the training's latest report, the time every rank may need to learn the step (elasticjob_store/stop.py).
MARGIN_SECONDS = 2.0


class Next(StrEnum):
    AS_TODAY = "AsToday"  # no stop: the pods go now
    ASK = "Ask"  # ask for one, and keep the pods
    WAIT = "Wait"  # asked: keep the pods until the training stopped or the grace passed
    GO = "Go"  # the training stopped and saved: the pods go
    EXPIRED = "Expired"  # the grace passed first: the pods go as without a stop


def next_step(pending: PlannedStop | None, listening: bool, grace: int, now: datetime) -> Next:
    """What to do about pods the operator wants gone. `pending` was advanced (advance) with what was seen."""
    if pending is None:
        return Next.ASK if listening and grace > 0 else Next.AS_TODAY
    if pending.stopped_time is not None:
        return Next.GO
    if pending.expired or now >= parse(pending.deadline):
        return Next.EXPIRED
    return Next.WAIT


def listening(plan: Plan, observed: Observed) -> bool:
    """The training asks should_stop() and steps, its store takes nudges (it restarts the survivors), and it is
    not recovering from an incident (its latest report may be of a process that is gone: no step to agree on)."""
    ledger = plan.status.goodput
    if ledger is not None and ledger.open_incident is not None:
        return False
    store = observed.store
    progress = store.progress if store is not None else None
    return store is not None and store.nudges_off is None and store.round is not None and not store.closed \
        and progress is not None and progress.listens and progress.step is not None


def advance(pending: PlannedStop, store: StoreView | None, now: datetime) -> bool:
    """Notes the step the store picked and whether every rank stopped at it; True when that is new."""
    if store is not None and store.stop_id == stop_id(pending) and store.stop_step is not None:
        pending.step = store.stop_step
    progress: ProgressView | None = store.progress if store is not None else None
    if pending.stopped_time is None and pending.step is not None and progress is not None \
            and progress.stopped_step == pending.step:
        pending.stopped_time = precise(now)
        return True
    return False


def hold(plan: Plan, job: Job, observed: Observed, reason: str, now: datetime) -> bool:
    """Whether the pods the operator wants gone stay for now: a planned stop is asked for or under way. False:
    they go (no stop asked, the training stopped and saved, or the grace passed)."""
    status, grace = plan.status, job.ref.spec.run_policy.stop_grace_seconds
    endpoint = control_endpoint(observed, job)
    pending = status.planned_stop
    if pending is not None and advance(pending, observed.store, now):
        plan.normal("StoppedAndSaved", f"every rank saved step {pending.step}: {describe(pending.reason)} goes on")
    found = next_step(pending, listening(plan, observed) and endpoint is not None, grace, now)
    if found in (Next.AS_TODAY, Next.GO):
        return False
    if found == Next.EXPIRED:
        assert pending is not None
        if not pending.expired:
            pending.expired = True
            plan.warn("StopGraceExpired", f"the training did not stop and save within stopGraceSeconds={grace}: "
                      f"{describe(pending.reason)} goes on without it")
        return False
    if pending is None:
        store = observed.store
        pending = status.planned_stop = PlannedStop(
            reason=reason, requested_time=precise(now), deadline=precise(now + timedelta(seconds=grace)),
            round=store.round if store is not None else None)
        plan.normal("StopRequested", f"{describe(reason)}: asked the training to stop after a step all ranks "
                    f"agree on and save it (at most {grace}s)")
    if pending.step is None and endpoint is not None:
        plan.act(StoreAction(Stop(parse(pending.requested_time).timestamp(), MARGIN_SECONDS), endpoint))
    plan.soon(min(1.0, max(0.0, (parse(pending.deadline) - now).total_seconds())))
    return True


def adopt(plan: Plan, job: Job, observed: Observed, desired: int, now: datetime) -> None:
    """A stop a worker's agent asked on SIGTERM (elasticjob_warm/evicted.py: an eviction, a node drain, or a
    scale-down the operator made before the training said it listens) that every rank saved: the ranks hold
    their processes, and where no pod joins to restart them (a scale-down) they would hold until their own
    timeout. The operator takes the stop as its own, once: settle() restarts the workers that stay once the pods
    that go are gone. Where the pod that asked is replaced (an eviction: a worker below `desired` is going or
    not running), its replacement's agent joining restarts them at the full size, once: they wait for it until
    `deadline`, stopGraceSeconds after every rank saved."""
    status, store = plan.status, observed.store
    if status.planned_stop is not None or store is None or store.stop_id is None or store.stop_step is None \
            or store.stop_id == status.last_stop or store.progress is None \
            or store.progress.stopped_step != store.stop_step:
        return
    try:
        asked = datetime.fromtimestamp(float(store.stop_id), tz=UTC)
    except (ValueError, OverflowError):
        return  # not a stop id this store writes
    wait = job.ref.spec.run_policy.stop_grace_seconds if replaced(observed, desired) else 0
    status.planned_stop = PlannedStop(reason="AgentAsked", requested_time=precise(asked),
                                      deadline=precise(now + timedelta(seconds=wait)), round=store.round,
                                      step=store.stop_step, stopped_time=precise(now))
    plan.normal("StoppedAndSaved", f"every rank saved step {store.stop_step} of the stop a worker's agent asked "
                "on SIGTERM: the workers that stay restart from it once the pods that go are gone")


def forget(plan: Plan) -> None:
    """The stop is over: remembered by its id, so a report that still says it was saved does not bring it back."""
    pending = plan.status.planned_stop
    if pending is not None:
        plan.status.last_stop = stop_id(pending)
    plan.status.planned_stop = None


def settle(plan: Plan, job: Job, observed: Observed, desired: int, now: datetime) -> None:
    """The stop once the pods it was for are going or gone: the workers that stay are restarted to re-form
    without those that went, and the stop is forgotten once they did (or at once when it expired: the survivors
    restart as they would have without it). After an eviction the survivors wait for the replacement the
    operator makes (its agent joining restarts them at the full size, once), stopGraceSeconds at most."""
    pending = plan.status.planned_stop
    if pending is None:
        return
    if advance(pending, observed.store, now):
        plan.normal("StoppedAndSaved", f"every rank saved step {pending.step}")
    found = next_step(pending, True, 1, now)
    if found == Next.WAIT:
        plan.soon(1)
        return  # the stop the store already told the ranks runs its course, whatever asked it
    store, endpoint = observed.store, control_endpoint(observed, job)
    reformed = store is not None and store.round is not None and store.round != pending.round
    if leaving(observed, desired) or (replacing(pending, now) and not reformed):
        plan.soon(1)
        return
    if found == Next.GO and store is not None and store.round is not None and store.round == pending.round \
            and store.complete and not store.closed and endpoint is not None:
        if not store.waiter_active:
            plan.act(StoreAction(Restart(store.round), endpoint, Event(
                "Normal", "RestartedAfterStop", f"the workers that stay restart from step {pending.step}, without "
                f"those that went")))
        plan.soon(1)
        return
    forget(plan)


def leaving(observed: Observed, desired: int) -> bool:
    """Workers above `desired`, or deleted (an eviction), whose containers have not stopped yet: the survivors
    restart only once they did, or they would rendezvous with them again."""
    return any(p.index is not None and (p.index >= desired or p.deleting) and p.finished_at is None
               and p.phase != "Succeeded" for p in observed.workers)


def replaced(observed: Observed, desired: int) -> bool:
    """A worker the operator keeps is going or not running yet: the pod that asked for the stop is replaced."""
    running = {p.index for p in observed.by_state.running if p.index is not None and p.index < desired}
    return len(running) < desired


def replacing(pending: PlannedStop, now: datetime) -> bool:
    """The survivors of a stop a worker's agent asked wait for its replacement to join (adopt)."""
    return pending.reason == "AgentAsked" and now < parse(pending.deadline)


def forget_once_gone(plan: Plan, observed: Observed) -> None:
    """A stop before every pod goes (suspension, Kueue): done once none is left."""
    if not observed.pods:
        forget(plan)


def stopping(plan: Plan) -> bool:
    """A planned stop is under way: workers that exit 0 did not finish the training."""
    return plan.status.planned_stop is not None


def describe(reason: str) -> str:
    return {"ScaleDown": "the scale-down", "Suspend": "the suspension", "Preempted": "Kueue's preemption",
            "Evicted": "Kueue's eviction",
            "AgentAsked": "the stop a worker's agent asked"}.get(reason, reason)


def stop_id(pending: PlannedStop) -> str:
    """The stop's name in the store (elasticjob_store/stop.py stop_id): its request time in unix seconds."""
    return f"{parse(pending.requested_time).timestamp():.3f}"


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
