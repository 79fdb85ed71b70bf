"""What a plan is made of: the job, what was observed, the actions and events that come out. Pure."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol

from elasticjob import naming
from elasticjob.domain import NO_PLACEMENT, JobRef, Placement, Settings
from elasticjob.models import Condition, ElasticJobStatus, Phase
from elasticjob.observe import PodView, ServiceView, SliceView, StoreView, WorkerPods
from elasticjob_store import protocol

RESYNC_SECONDS = 300.0


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class CreateObject:
    manifest: dict[str, Any]
    event: Event | None = None  # posted only when the object was really created
    # One per namespace, shared by its jobs (the NetworkPolicy around its stores): created once, not per job.
    per_namespace: bool = False
    # The collection of an object of an integration's API (a PodGroup's, a Workload's), which the client does not
    # know; None for the kinds it does (k8s.PLURALS).
    plural: str | None = None


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str
    grace_seconds: int | None = None
    event: Event | None = None  # posted only when the pod was really there


@dataclass(frozen=True)
class DeleteService:
    name: str
    uid: str = ""


class ControlAddress(NamedTuple):
    """Where the operator reaches a job's store: the store pod's own IP (the pod the operator made, never what a
    Service's endpoints say) and its control port. Built once, in one place (recovery.control_endpoint for the
    planner, observing.read_store for the watch), and never parsed back from a string."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class StoreAction:
    """A nudge to the job's store through its control endpoint: remove, complete or restart, as the store's
    protocol types them (the controller's client writes them on the wire)."""

    request: protocol.Request
    endpoint: ControlAddress
    event: Event | None = None  # posted only when the store did it

    @property
    def kind(self) -> str:
        return self.request.KIND


@dataclass(frozen=True)
class DeleteObject:
    """An object of another API the job owns (a PodGroup), by uid."""

    api_version: str
    kind: str
    plural: str
    name: str
    uid: str = ""
    event: Event | None = None  # posted only when it was really deleted
    resource_version: str = ""  # deleted only if unchanged since (a pending Kueue slice Kueue may admit meanwhile)


@dataclass(frozen=True)
class Leftover:
    """A Pod or Service under this job's name whose controlling owner is another ElasticJob uid."""

    kind: str
    name: str
    uid: str
    owner_uid: str


@dataclass(frozen=True)
class NameTaken:
    """A name the operator asked for (409) that an object it will never see as the job's holds (no job label, or
    not controlled by an ElasticJob of this name); the suffix, random, is the one to take instead."""

    kind: str
    name: str
    holder_uid: str
    suffix: str


@dataclass(frozen=True)
class CollectLeftover:
    """Delete a leftover by uid, once the job is read afresh (see controller/apply.py collect)."""

    leftover: Leftover
    event: Event | None = None  # posted only when it was really deleted


@dataclass(frozen=True)
class DefaultReplicas:
    replicas: int


@dataclass(frozen=True)
class SetSuspend:
    """spec.runPolicy.suspend, written before status (like DefaultReplicas): the job's own switch, which an
    integration's gate (Kueue's) turns."""

    suspend: bool
    event: Event | None = None


@dataclass(frozen=True)
class IntegrationAction:
    """A write of an integration's own, which the controller hands back to the integration that planned it
    (elasticjob/integrations.py). Its subclasses live in the integration's package and carry their own fields;
    `event`, when a subclass has one, is posted only when the write took effect."""


@dataclass(frozen=True)
class DeleteJob:
    pass


@dataclass(frozen=True)
class ApplyObject:
    """Server-side apply of an object the job owns and the operator keeps as planned (the rendezvous Service's
    EndpointSlice); sent only when it differs from what this operator last applied."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class TaintNode:
    """A node the job avoids for a reason of the node's own, tainted for every pod (--taint-bad-nodes, planner/
    nodes.py taint): idempotent, as the planner cannot see the node (the controller writes the taint and its end
    together and only ever moves the end later, elasticjob/taints.py)."""

    node: str
    reason: str  # the avoidance's, one CamelCase word: the taint's value
    until: str  # RFC 3339: when the job's avoidance ends
    event: Event | None = None  # posted only when the node was really changed


@dataclass(frozen=True)
class UntaintNode:
    """The job's avoidance of the node ended: its taint goes unless a later end is written on the node (another
    job's, or one this job wrote before its avoidNodeSeconds was lowered)."""

    node: str
    event: Event | None = None  # posted only when the taint was really removed


Action = (CreateObject | DeletePod | DeleteService | DefaultReplicas | DeleteJob | StoreAction | DeleteObject
          | SetSuspend | IntegrationAction | CollectLeftover | ApplyObject | TaintNode | UntaintNode)


def spec_changes(actions: list[Action]) -> tuple[dict[str, Any], list[Event]]:
    """The spec fields a plan sets (the replicas default, an integration's suspend), and their Events: written before
    anything else, since the rest of the plan was made without them."""
    patch: dict[str, Any] = {}
    events = []
    for action in actions:
        if isinstance(action, DefaultReplicas):
            patch["replicas"] = action.replicas
        elif isinstance(action, SetSuspend):
            patch["runPolicy"] = {"suspend": action.suspend}
            events += [action.event] if action.event else []
    return patch, events


@dataclass(frozen=True)
class Job:
    ref: JobRef
    generation: int
    status: ElasticJobStatus
    created: datetime | None = None  # metadata.creationTimestamp


@dataclass(frozen=True)
class RoundFailure:
    """A worker failure torchrun handled in place, as its agent logged it (read from the pod's log)."""

    pod: str
    exit_code: int
    message: str = ""


@dataclass(frozen=True)
class Observed:
    """Everything the planner decides on besides the job itself."""

    pods: list[PodView]
    service: ServiceView | None
    store: StoreView | None = None
    # Ready per node, for the nodes of pods stuck terminating; None: the node is gone.
    nodes: Mapping[str, bool | None] = field(default_factory=dict)
    # The failures behind new in-place restarts, from the agents' logs (empty when not read): only what they
    # logged since the logs were last read, so that a line is evidence for one round (controller/observing.py).
    round_failures: list[RoundFailure] = field(default_factory=list)
    # Seconds until the agents' logs may be read again (read at most so often per job): a new failure round
    # waits for them rather than being judged without.
    round_failures_wait: float = 0.0
    # The API server's words when it last refused to create the job's objects, and when to try again.
    refused: str | None = None
    retry_at: datetime | None = None
    # What each integration observed for the job (the gang's PodGroup, Kueue's Workloads), as the integration's
    # own view, which also makes its decisions (Integration): the planner names none of them.
    integrations: tuple[Integration, ...] = ()
    # Pods and Services under this job's name that an earlier job of that name left behind.
    leftovers: list[Leftover] = field(default_factory=list)
    # Names of pods under this job's name that are not its own (an earlier job's, still terminating).
    taken: frozenset[str] = frozenset()
    # Names the operator asked for that another object holds (planner/ownership.py rename_taken).
    squatted: tuple[NameTaken, ...] = ()
    # The Service under the job's rendezvous Service name, controlled by the job, that the operator did not make
    # (or that routes by a selector): replaced.
    rejected_service: ServiceView | None = None
    # Every EndpointSlice that names the job's rendezvous Service; only the operator's own may stay.
    endpoint_slices: tuple[SliceView, ...] = ()

    @functools.cached_property
    def workers(self) -> list[PodView]:
        return [p for p in self.pods if p.role == "worker"]

    @functools.cached_property
    def by_state(self) -> WorkerPods:
        """The workers sorted once by what they are doing: what every policy counts (observe.WorkerPods)."""
        return WorkerPods.of(self.workers)

    @property
    def store_pod(self) -> PodView | None:
        return next((p for p in self.pods if p.role == naming.ROLE_RENDEZVOUS), None)


@dataclass(frozen=True)
class Allowance:
    """What the integrations let a job run now: at most `workers` workers (None: as many as it wants), placed
    as they say (a gang's membership, a flavor's nodes)."""

    workers: int | None = None
    worker: Placement = NO_PLACEMENT
    store: Placement = NO_PLACEMENT
    # Why `workers` caps the job below its replicas, in the integration's words (the job's message shows it).
    note: str = ""

    def merge(self, other: Allowance) -> Allowance:
        """Both at once: the lesser count (and its note), both placements (the later one's scheduler wins)."""
        counts = [n for n in (self.workers, other.workers) if n is not None]
        least = min(counts) if counts else None
        note = next((a.note for a in (self, other) if a.workers is not None and a.workers == least), "")
        return Allowance(least, self.worker.merge(other.worker), self.store.merge(other.store), note)

    def replicas(self, wanted: int) -> int:
        """The workers the job runs: what the spec wants, capped by what was allowed. Decided here only."""
        return wanted if self.workers is None else min(wanted, self.workers)


UNGATED = Allowance()


class Integration(Protocol):
    """An integration's part in a plan (as Kueue's jobframework.GenericJob is the job's part in Kueue's): made by
    the controller from what it observed for the job (elasticjob/integrations.py), so that the planner calls it
    without knowing which it is. Pure."""

    def gate(self, plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> Allowance | None:
        """Before anything runs: None holds the job (the integration planned why); else what it may run."""
        ...

    def ready_for_workers(self, plan: Plan, job: Job, observed: Observed) -> bool:
        """Just before workers are made: whether they may be (what they need, such as their gang, is there)."""
        ...

    def finish(self, plan: Plan, job: Job, observed: Observed, settings: Settings, now: datetime) -> None:
        """The job ended: what the integration releases."""
        ...


@dataclass(frozen=True)
class CutOff:
    """An agent recovery.py took out of a running round for its silence (a partition, a freeze), as the downtime
    ledger books it: a pod left running books no failure, and a fenced one's failure is booked at detection."""

    pod: str
    uid: str
    reason: str  # what the operator saw: PodNotReady, NodeNotReady; NoHeartbeat, Unanswered or TrainingStalled (the
    # store's word)
    last_heartbeat: datetime  # on the operator's clock: the answer's time less the heartbeat's age


@dataclass
class Plan:
    status: ElasticJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float = RESYNC_SECONDS
    cut_off: list[CutOff] = field(default_factory=list)  # this reconcile's, for the ledger (ledger.py)
    # An integration took the job's quota back this reconcile (Kueue preempted or evicted it): why, for the ledger.
    preempted: str | None = None

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def normal(self, reason: str, message: str) -> None:
        self.events.append(Event("Normal", reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.events.append(Event("Warning", reason, message))

    def soon(self, seconds: float) -> None:
        self.requeue_after = max(1.0, min(self.requeue_after, seconds))


def stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def precise(when: datetime) -> str:
    """RFC 3339 with milliseconds, for times compared with the training's steps (a tenth of a second apart)."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def since(value: str | None, now: datetime) -> timedelta | None:
    if not value:
        return None
    return now - datetime.fromisoformat(value.replace("Z", "+00:00"))


def condition(status: ElasticJobStatus, kind: str) -> Condition | None:
    return next((cond for cond in status.conditions if cond.type == kind), None)


def set_condition(status: ElasticJobStatus, kind: str, value: bool, reason: str, message: str,
                  now: datetime, generation: int) -> None:
    wanted: Literal["True", "False"] = "True" if value else "False"
    if cond := condition(status, kind):
        if cond.status != wanted:
            cond.last_transition_time = stamp(now)
        cond.status, cond.reason, cond.message, cond.observed_generation = wanted, reason, message, generation
        return
    status.conditions.append(Condition(type=kind, status=wanted, reason=reason, message=message,
                                       last_transition_time=stamp(now), observed_generation=generation))


def enter_phase(plan: Plan, job: Job, phase: Phase, reason: str, message: str, now: datetime,
                warn: bool = False) -> None:
    status = plan.status
    # A new job's first Pending and first Running say nothing its conditions, its phase and the creation
    # Events do not (Events say what the operator did; Running again after a restart or a lost store keeps its
    # Event: it ends an incident).
    first_pending = status.reason is None and phase == Phase.PENDING
    first_running = (phase == Phase.RUNNING and status.reason in (None, "Waiting") and status.restarts == 0
                     and status.rendezvous.restarts == 0)
    if (status.phase != phase or status.reason != reason) and not (first_pending or first_running):
        event = plan.warn if warn or phase in (Phase.FAILED, Phase.RESTARTING) else plan.normal
        event(reason, message)
    status.phase, status.reason, status.message = phase, reason, message
    if phase.finished and not status.completion_time:
        status.completion_time = stamp(now)
    for kind in ("Running", "Restarting", "Succeeded", "Failed", "Suspended"):
        active = kind == phase.value
        set_condition(status, kind, active, reason if active else f"Not{kind}", message if active else "",
                      now, job.generation)
