"""The job's store as the operator sees it (store_reply.py parses its answer into these): torch's rendezvous, the
training's progress, each pod's pace, the gate's peers, the agents' node checks and link probe. Pure views."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class StoreNode:
    """One torch agent in the rendezvous: its address (--local-addr, the pod IP), the age of its last heartbeat
    when the store answered, whether that age passed one missed keep-alive, and for how long the address's kernel
    had answered none of the store's TCP (keep-alive probes, data: elasticjob_store/peers.py), if it had not."""

    addr: str
    heartbeat_age: float | None = None
    stale: bool = False
    unanswered: float | None = None


@dataclass(frozen=True, slots=True)
class ProgressView:
    """The training's own report (elasticjob_progress, rank 0), as its store kept it: the tenant's word, shown in
    the downtime ledger and never used to charge or fence (a stall only hastens taking a silent agent out of the
    tenant's own rendezvous: planner/recovery.py). Times are the worker's clock."""

    pod: str = ""
    restart: int = 0
    started_at: datetime | None = None  # this worker process made its Progress()
    step: int | None = None
    step_at: datetime | None = None
    step_seconds: float | None = None  # its recent mean step time
    first_step: int | None = None  # the first step this worker process did, and when
    first_step_at: datetime | None = None
    saved_step: int | None = None
    saved_at: datetime | None = None
    loading_at: datetime | None = None
    loaded_step: int | None = None
    loaded_at: datetime | None = None
    received_at: datetime | None = None  # the store's clock when the report last changed
    listens: bool = False  # the script asks should_stop(): a planned stop reaches it
    stopped_step: int | None = None  # every rank saved this step of a planned stop, and when
    stopped_at: datetime | None = None
    # No step for a few steps' time, as of the store's answer (it answers when this changes): all ranks wait.
    stalled: bool = False
    previous_pod: str = ""  # the pod that reported before `pod` did (rank 0's pod before the last restart)


@dataclass(frozen=True, slots=True)
class PaceView:
    """How long a pod's model forward takes (elasticjob_progress.Progress.watch, every rank; the slowest of the
    pod's ranks), as its store kept it: the tenant's word. It may get one of the job's own pods replaced through
    a planned stop, uncharged (planner/stragglers.py), and nothing else."""

    pod: str
    seconds: float
    ranks: int = 1


@dataclass(frozen=True, slots=True)
class NodeCheckView:
    """What an agent's node check cost its join (elasticjob_warm/nodecheck.py, by the agent's address): the
    tenant's word, booked in the ledger's nodeCheck phase and nothing else."""

    addr: str
    held: float  # seconds the join waited for the check
    at: datetime  # when the check ended, on the pod's clock


@dataclass(frozen=True, slots=True)
class LinksView:
    """The link probe's verdict for a round (elasticjob_warm/linkprobe.py, written by the round's rank 0, mapped
    to an agent's address by the store): the tenant's word. It may get one of the job's own pods replaced through
    a planned stop, uncharged (planner/links.py), once per round, and nothing else."""

    round: int
    world: int
    seconds: float
    outlier: str | None = None  # the address of the agent whose every link is slow
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PeersView:
    """The store's gate (elasticjob_store/gate.py): the addresses it lets through, whether the operator has named
    any since the store started, and the connections it refused (the last addresses among them)."""

    told: bool
    allowed: tuple[str, ...]
    refused: int = 0
    last_refused: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SeatsView:
    """The seats of a job with spares (elasticjob_store/seats.py): how many agents may be in its rounds, which
    addresses hold one (`joining`: granted, not in the rendezvous yet), and which spares wait for one."""

    count: int
    held: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()
    joining: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoreView:
    """torch's rendezvous as the job's store reports it (validated by the client; never unpickled here)."""

    epoch: str
    round: int | None
    complete: bool = False
    closed: bool = False
    participants: tuple[StoreNode, ...] = ()
    waiting: tuple[StoreNode, ...] = ()
    failure_rounds: int = 0
    last_failure_round_at: datetime | None = None
    version: int = 0
    waiter_active: bool = False
    nudges_off: str | None = None  # why the store turned its nudges off on its torch (compat.py); None: on
    nudges_checked: bool = True  # False while a new store still checks its torch (off until then, not for good)
    plain_torchrun: str | None = None  # agents whose warm wrapper ran plain torchrun, and why; None: none did
    received_at: datetime | None = None  # the operator's clock when the answer came: ages grow from there
    progress: ProgressView | None = None  # the training's report (elasticjob_progress); None without one
    stop_id: str | None = None  # the planned stop the store last wrote (protocol.Stop), and its step
    stop_step: int | None = None
    round_completed_at: datetime | None = None  # when the store saw the current round complete (its clock)
    round_forming_since: datetime | None = None  # ... and the round before it first break up (an agent re-forming)
    last_round_nodes: tuple[str, ...] = ()  # the addresses of the latest round the store saw complete
    pace: tuple[PaceView, ...] = ()  # each pod's forward time, where the script watches its model
    peers: PeersView | None = None  # the store's gate; None: the store answers every peer
    node_checks: tuple[NodeCheckView, ...] = ()  # the latest round's members' node-check costs
    links: LinksView | None = None  # the link probe's verdict for the latest round; None: none read
    seats: SeatsView | None = None  # a job with spares: its seats; None: every agent joins

    @property
    def nodes(self) -> int:
        return len(self.participants)

    def age(self, node: StoreNode, now: datetime) -> float | None:
        """The node's heartbeat age now. The store answers a long-poll as soon as a heartbeat goes stale, so a
        node it has not flagged stale is still fresh; only a stale node's age grows from the answer."""
        if node.heartbeat_age is None or not node.stale:
            return node.heartbeat_age
        later = (now - self.received_at).total_seconds() if self.received_at else 0.0
        return node.heartbeat_age + max(0.0, later)
