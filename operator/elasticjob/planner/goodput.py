"""Where an incident's seconds went: from the moments the operator saw and the training reported, the seconds
lost per phase. Pure.

The phases tile the incident's timeline, each from the end of the one before to its own mark:

    fault -> detected -> replaced -> round re-formed -> [load begins] -> load done -> recompute done
            detect      replace      rendezvous         worker start     checkpoint   recompute
                                     (node check)                        load

The node check is not a moment the operator sees but the seconds the joining agents said their check held their
join: it is taken out of the rendezvous phase (at most all of it), so the phases still add up.

Marks are observed at different moments (a pod seen running after the round the store already reported), so
each phase counts only from the furthest mark before it: a late mark costs 0, never a negative number, and
the phases add up to the time from the fault to the last mark. A phase whose mark was never seen is null
(unknown), not 0: the operator sees the first three; the rest need the training's reports (elasticjob_progress).
Recompute is not a moment but steps: those done again, from the step the checkpoint held to the last step
before the fault, at the training's own step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from elasticjob.models import LostPhases

# The most time a report's step is carried forward to the fault at the training's step time: reports come once
# a second, so more means the training was not stepping anyway.
MAX_CARRY_SECONDS = 5.0
PHASE_NAMES = ("detect", "replace", "node_check", "rendezvous", "worker_start", "checkpoint_load", "recompute")


@dataclass(frozen=True)
class Marks:
    start: datetime  # the fault
    detected: datetime
    replaced: datetime | None = None  # every wanted worker running again
    round: datetime | None = None  # the store reported the group re-formed
    loading: datetime | None = None  # the training began loading its checkpoint (progress.loading())
    loaded: datetime | None = None  # ... and had it loaded (progress.loaded(step))
    first_step: datetime | None = None  # the first step after the restart
    loaded_step: int | None = None
    last_step: int | None = None  # the step at the fault
    step_seconds: float | None = None  # the training's step time
    node_check: float | None = None  # seconds the joining agents' node check held the round (their word)


def phases(marks: Marks) -> LostPhases:
    cursor = trained_on(marks)
    seen: dict[str, float | None] = {}
    # The training's own marks count only once it stepped again: until then a phase may still be running.
    resumed = marks.first_step is not None
    load_began = marks.loading if resumed else None
    load_done = marks.loaded if resumed else None
    start_done = load_began or load_done or (marks.first_step if resumed else None)
    # What the operator saw after the training had its checkpoint loaded (or stepped) cost nothing more: the
    # survivors of a lost pod re-form and step before its replacement runs, or before the failure is booked.
    ceiling = (load_done or marks.first_step) if resumed else None
    for name, mark in (("detect", marks.detected), ("replace", marks.replaced), ("rendezvous", marks.round),
                       ("worker_start", start_done)):
        if mark is None and resumed and name in ("replace", "rendezvous"):
            # The training stepped again before the operator saw the pods or the round (a warm restart in place
            # is done in about a second): they are over, within the time the phases before already counted.
            mark = cursor
        if ceiling is not None and mark is not None:
            mark = min(mark, ceiling)
        seen[name], cursor = _span(cursor, mark)
    seen["node_check"], seen["rendezvous"] = split_node_check(seen["rendezvous"], marks.node_check)
    seen["checkpoint_load"] = _span(cursor, load_done)[0] if load_began is not None else None
    seen["recompute"] = recompute(marks) if resumed else None
    return LostPhases(**seen)


def split_node_check(rendezvous: float | None, held: float | None) -> tuple[float | None, float | None]:
    """(node check, rendezvous): the check's hold taken out of the rendezvous phase, never more than all of it."""
    if rendezvous is None or held is None:
        return None, rendezvous
    check = round(min(max(0.0, held), rendezvous), 3)
    return check, round(rendezvous - check, 3)


def trained_on(marks: Marks) -> datetime:
    """When the training really stopped. The step at the fault comes from a report up to a second old; a
    checkpoint loaded after it that is newer (the workers saved on their way out: a restart torch made with
    SIGTERM) shows the training stepped on to it, at its step time, and that time was not lost."""
    if marks.first_step is None or marks.loaded_step is None or marks.last_step is None or not marks.step_seconds:
        return marks.start
    ahead = marks.loaded_step - marks.last_step
    if ahead <= 0:
        return marks.start
    later = marks.start + timedelta(seconds=ahead * marks.step_seconds)
    return min(later, marks.loading or marks.loaded or marks.first_step)


def _span(cursor: datetime, mark: datetime | None) -> tuple[float | None, datetime]:
    if mark is None:
        return None, cursor
    return round(max(0.0, (mark - cursor).total_seconds()), 3), max(cursor, mark)


def recompute(marks: Marks) -> float | None:
    """Seconds of steps done again; None without the step loaded, the step at the fault or the step time."""
    if marks.loaded_step is None or marks.last_step is None or marks.step_seconds is None:
        return None
    return round(max(0, marks.last_step - marks.loaded_step) * marks.step_seconds, 3)


def lost(found: LostPhases) -> float:
    """The seconds lost that were seen: the known phases added up."""
    known: list[float] = [value for name in PHASE_NAMES if (value := getattr(found, name)) is not None]
    return round(sum(known), 3)


def biggest(found: LostPhases) -> tuple[str, float] | None:
    """The phase that cost most, by its wire name (workerStart), and its seconds; None when none is known."""
    known = [(value, name) for name in PHASE_NAMES if (value := getattr(found, name)) is not None]
    if not known:
        return None
    value, name = max(known)
    return wire_name(name), value


def wire_name(name: str) -> str:
    """A phase as status and the metrics name it: workerStart for worker_start."""
    return LostPhases.model_fields[name].alias or name


def step_at_fault(step: int | None, step_at: datetime | None, step_seconds: float | None,
                  fault: datetime) -> int | None:
    """The training's step at the fault, from its last report before it: the steps its step time fits between
    the report and the fault are added (reports come once a second; ten steps at 10 per second)."""
    if step is None:
        return None
    if step_at is None or step_seconds is None or step_seconds <= 0 or step_at >= fault:
        return step
    return step + int(min((fault - step_at).total_seconds(), MAX_CARRY_SECONDS) / step_seconds)


def fault_start(evidence: datetime, slack: timedelta | None, detected: datetime, started_at: datetime | None,
                step_at: datetime | None) -> datetime:
    """When the training stopped, from the operator's evidence and the training's last step before it.

    `evidence` is the earliest the fault can have been, and it can be early: a container's finishedAt is
    truncated to the second by Kubernetes (a kill at 10.7 s reads 10 s; seen: a ledger's 3.4 s against 1.3 s
    measured), a cut-off agent's last heartbeat came up to a keep-alive before it went silent. The training's
    last reported step (rank 0's `step_at`, sub-second) is a better mark when it is later: the training stepped
    until then, so nothing was lost before it. It counts only from the process that was running at the evidence
    (one started after it is a replacement), within `slack` of the evidence (a step later than the fault can have
    been is a world that stepped on without the lost pod; None: no bound but detection), and never after the
    operator saw the fault."""
    if step_at is None or step_at <= evidence or step_at > detected:
        return evidence
    if started_at is None or started_at > evidence:
        return evidence
    if slack is not None and step_at >= evidence + slack:
        return evidence
    return step_at


def ettr(wall_seconds: float, lost_seconds: float) -> float | None:
    """Goodput (effective training time ratio), in percent; None before any wall time."""
    if wall_seconds <= 0:
        return None
    return round(100.0 * max(0.0, wall_seconds - lost_seconds) / wall_seconds, 2)
