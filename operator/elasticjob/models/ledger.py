"""The job's downtime ledger and its planned stops, in its status: incidents and the seconds each lost."""

from __future__ import annotations

from pydantic import Field

from elasticjob.models.base import Model


class LostPhases(Model):
    """Where one incident's seconds went. Null: not seen (the phases after the round need the training's progress
    reports, elasticjob_progress), never zero."""

    detect: float | None = Field(None, description="From the fault to the operator seeing it.")
    replace: float | None = Field(None, description="Until every wanted worker pod was scheduled and running "
                                  "again (0 when no pod was replaced).")
    node_check: float | None = Field(None, description="Of the time until the group re-formed, what the joining "
                                     "agents' node check held their join (the longest; spec.nodeCheck): reported by "
                                     "the kit's agents, 0 when no agent checked after the fault. Counted out of "
                                     "rendezvous, never twice.")
    rendezvous: float | None = Field(None, description="Until the store reported the worker group re-formed, "
                                     "less nodeCheck.")
    worker_start: float | None = Field(None, description="From the round to the checkpoint load's start "
                                       "(progress.loading()), or to its end without it: imports, the process "
                                       "group. Needs the progress API.")
    checkpoint_load: float | None = Field(None, description="The checkpoint load (progress.loading() to "
                                          "progress.loaded()). Needs the progress API, and loading().")
    recompute: float | None = Field(None, description="Steps done again: from the step loaded to the last step "
                                    "before the fault, at the training's own step time. Needs the progress API.")


class PlannedStop(Model):
    """A stop the operator asked the training for before removing workers: pods that exit meanwhile did not
    finish the training."""

    reason: str = Field(description="Why: ScaleDown, Suspend, Preempted, Evicted (by Kueue) "
                        "or AgentAsked (a worker's agent asked it on SIGTERM).")
    requested_time: str = Field(description="When the operator asked (RFC 3339 with milliseconds, UTC); it names "
                                "the stop in the store.")
    deadline: str = Field(description="When the pods go whether or not the training stopped: requestedTime + "
                          "runPolicy.stopGraceSeconds. For AgentAsked: until when the workers that stay wait for "
                          "an evicted pod's replacement to join them.")
    round: int | None = Field(None, description="The store's round when asked: the survivors of a scale-down "
                              "re-form in a later one.")
    step: int | None = Field(None, description="The step every rank stops after, as the store picked it.")
    stopped_time: str | None = Field(None, description="When the operator saw every rank saved that step; then "
                                     "the pods go.")
    expired: bool = Field(False, description="The deadline passed first: the pods went as without a stop.")


class Incident(Model):
    """One fault and the training time it cost, from the operator's own observations and, where the training
    reports it (elasticjob_progress), its steps and checkpoints: shown, never used to charge or decide."""

    kind: str = Field(description="WorkerLost, Rank0Lost (the pod of the rank that reports progress), NodeLost, "
                      "Partition, StoreLost, ScaleChange, Preemption, Suspend, or Rejoin (the group re-formed "
                      "with no fault booked: an agent joined, a replacement or one back from a partition, or the "
                      "agents re-formed on a store that came back; torch restarted every worker).")
    reason: str = Field("", description="What the operator saw: a failure's reason (Error, Killed, Evicted, "
                        "...), StoreLost, ScaleUp or ScaleDown, Preempted.")
    pod: str | None = Field(None, description="The pod it happened to, if one.")
    start_time: str = Field(description="When the fault happened, as far as the operator can tell (a "
                            "container's end, the store's loss, the scale change) (RFC 3339, UTC).")
    detected_time: str | None = Field(None, description="When the operator saw it.")
    replaced_time: str | None = Field(None, description="When every wanted worker ran again.")
    round_time: str | None = Field(None, description="When the store reported the group re-formed.")
    node_check_held: float | None = Field(None, description="The longest an agent that joined the re-formed "
                                          "group waited for its node check (the agents' word), once every member "
                                          "of that group had said.")
    round: int | None = Field(None, description="The store's round when the fault was seen: a later complete "
                              "one is the group re-formed.")
    epoch: str | None = Field(None, description="The store's epoch then (a new store counts rounds anew).")
    last_step: int | None = Field(None, description="The training's step at the fault, from its last report "
                                  "(and its step time); for a planned stop, the step every rank saved.")
    stopped_step: int | None = Field(None, description="A planned stop: the step every rank saved before the "
                                     "pods went; none is recomputed.")
    end_time: str | None = Field(None, description="When it was closed: the training's first step after it, "
                                 "or without progress reports the round re-formed.")
    lost_seconds: float | None = Field(None, description="Training seconds lost: the phases added up, the "
                                       "unknown ones left out.")
    phases: LostPhases | None = Field(None, description="The seconds lost per phase, once closed.")


class ShortOfSize(Model):
    """A stretch in which the training runs with fewer nodes than the job wants, not yet added to
    capacityLostSeconds."""

    since: str = Field(description="When it began: the round with fewer nodes seen, or the incident that left it "
                       "closed (RFC 3339, UTC).")
    nodes: int = Field(description="The nodes in the training's round (the store's latest complete round).")
    desired: int = Field(description="The workers the job wanted meanwhile (status.desiredReplicas).")


class GoodputStatus(Model):
    """The job's downtime ledger: how much of its wall time trained (ETTR, goodput), and where the rest went."""

    since: str | None = Field(None, description="When the ledger started: the job's first Running (RFC 3339).")
    wall_seconds: float = Field(0.0, description="Seconds from `since` to the ledger's last account: an "
                                "incident's close, or the end of a stretch short of the job's size (the ledger "
                                "is written when one of those changes, not every second).")
    lost_seconds: float = Field(0.0, description="Training seconds lost in closed incidents, over all phases "
                                "seen.")
    goodput_percent: float | None = Field(None, description="100 x (wallSeconds - lostSeconds) / wallSeconds: "
                                          "the share of wall time spent training (ETTR); null before the ledger's "
                                          "first account (an incident closed, a stretch short of size ended).")
    capacity_lost_seconds: float = Field(0.0, description="Outside incidents, the seconds the training ran with "
                                         "fewer nodes than desiredReplicas, each weighted by the share missing: "
                                         "a second at 2 of 3 nodes counts 1/3. A stretch still going is in "
                                         "shortOfSize, not yet here.")
    weighted_goodput_percent: float | None = Field(None, description="100 x (wallSeconds - lostSeconds - "
                                                   "capacityLostSeconds) / wallSeconds: ETTR with each second "
                                                   "weighted by the nodes that trained over the nodes wanted; "
                                                   "null like goodputPercent.")
    short_of_size: ShortOfSize | None = Field(None, description="The stretch short of the job's size being "
                                              "counted now, if any.")
    incidents: int = Field(0, description="Incidents closed.")
    progress_reported: bool = Field(False, description="Whether the training reports its steps "
                                    "(elasticjob_progress): without it the phases after the round are null.")
    open_incident: Incident | None = Field(None, description="The incident being recovered from, if any.")
    queued_incidents: list[Incident] = Field(default_factory=list, description="Faults seen while the open "
                                             "incident was open, oldest first (4 at most): once it closes, each "
                                             "that began after the training stepped again is an incident of its "
                                             "own; one that began before is part of it.")
    round: int | None = Field(None, description="The store's last complete round the ledger accounted for: one "
                              "completed past it with no incident open is a Rejoin.")
    epoch: str | None = Field(None, description="The store's epoch of that round (a new store counts anew).")
    last_incidents: list[Incident] = Field(default_factory=list, description="The last 5 closed incidents, "
                                           "oldest first.")
