"""The ElasticJob's status: what the operator shows of the job."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field

from elasticjob.models.base import Model
from elasticjob.models.ledger import GoodputStatus, PlannedStop


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"  # waiting for Kueue to admit it (again)

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class Condition(Model):
    """One aspect of the job's state, in the usual Kubernetes form."""

    type: str = Field(description="What it is about: Running, Restarting, Succeeded, Failed, Suspended, "
                      "RendezvousReady, Admitted (Kueue), ReplicaFailure (a create the API server refused), "
                      "RendezvousNudges or WarmStarts.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="Why it has this status, one CamelCase word (e.g. FailedCreate, "
                        "KitLauncher, CommandNotTorchrun).")
    message: str = Field("", description="Why, in words; for ReplicaFailure the API server's own.")
    last_transition_time: str | None = Field(None, description="When status last changed (RFC 3339, UTC).")
    observed_generation: int | None = Field(None, description="The job's metadata.generation when it was last "
                                            "set; below the job's, it predates the latest spec change.")


class FailureRecord(Model):
    """One worker failure the operator saw: a pod that ended badly, or an in-place restart torchrun made."""

    pod: str = Field(description="The worker pod's name; empty for an in-place restart no pod's log named.")
    uid: str = Field(description="The pod's uid; for an in-place restart torchrun made (a failure round of the "
                     "store), the store's epoch and round count.")
    replica_index: int | None = Field(None, description="The worker's index (its label "
                                      "elasticjob.dev/replica-index).")
    exit_code: int | None = Field(None, description="The worker's exit code when the agent reported it, "
                                  "else the container's.")
    reason: str = Field(description="Error, OOMKilled, Killed, Evicted, Preempted, NodeLost, Partitioned, "
                        "RendezvousLost, FatalExitCode, MaxRestartsExceeded, or Unconfirmed (an in-place restart "
                        "the store reported that no pod or log confirms: never charged).")
    message: str = Field("", description="What happened, in words: the operator's finding and the last lines "
                         "the worker's agent logged (its termination message).")
    charged: bool = Field(True, description="Whether it consumed the restart budget (maxRestarts).")
    time: str | None = Field(None, description="When the pod ended or the failure happened (RFC 3339, UTC).")


class AvoidedNode(Model):
    """A node the job's next pods keep off (failurePolicy.avoidNodeSeconds), and why."""

    node: str = Field(description="The node's name.")
    reason: str = Field(description="What the operator saw there, one CamelCase word: WorkerFailed (a worker "
                        "failed on it), Partitioned (a pod on it was cut off from the network), NodeCheckFailed "
                        "(the kit's check failed there) or SlowNode (a worker there was slower than the others).")
    message: str = Field("", description="The failure that made the job avoid the node, in words.")
    since: str = Field(description="When the first such failure happened (RFC 3339, UTC).")
    until: str = Field(description="When the avoidance ends (RFC 3339, UTC): since + "
                       "failurePolicy.avoidNodeSeconds.")
    failures: int = Field(1, description="Failures attributed to the node since then; the later ones were part of "
                          "the first one's incident and cost no restart.")


class Straggler(Model):
    """A worker pod slower than the others (spec.stragglers), replaced once it stays so for windowSeconds."""

    pod: str = Field(description="The worker pod.")
    node: str | None = Field(None, description="Its node.")
    factor: float = Field(description="How many times the median of the other pods' forward time its own took, "
                          "when last seen.")
    seconds: float = Field(description="Its forward time (the slowest of its ranks), in seconds, when last seen.")
    since: str = Field(description="Since when it has been that slow (RFC 3339, UTC).")
    uid: str | None = Field(None, description="The pod's uid.")
    replaced: bool = Field(False, description="The pod was deleted for it; kept until that pod is gone.")


class RendezvousStatus(Model):
    """The job's rendezvous store, as the operator sees it."""

    endpoint: str | None = Field(None, description="ClusterIP:port the agents rendezvous at.")
    run_id: str | None = Field(None, description="The rendezvous id the agents use (PET_RDZV_ID): the job's "
                               "uid.")
    pod: str | None = Field(None, description="The name of the rendezvous store pod.")
    ready: bool = Field(False, description="Whether the store serves now.")
    round: int | None = Field(None, description="torch's rendezvous round: how often the worker group has "
                              "(re)formed, counting torchrun's in-place restarts and membership changes.")
    nodes: int | None = Field(None, description="Nodes (agents) in the current round.")
    restarts: int = Field(0, description="Times the rendezvous pod was lost and recreated.")
    last_lost_time: str | None = Field(None, description="When the store last stopped serving (RFC 3339, UTC).")
    service_uid: str | None = Field(None, description="The uid of the rendezvous Service the operator made, once "
                                    "seen: only that Service counts (another of its name is replaced).")
    service_serial: int = Field(0, description="Which making of the rendezvous Service counts, written before "
                                "it is made: a Service signed for an earlier making is not the job's.")
    epoch: str | None = Field(None, description="Identity of the store process whose counters failureRounds "
                              "refers to; a new store starts counting from zero.")
    failure_rounds: int = Field(0, description="Rounds the store saw re-formed by the same nodes (torchrun "
                                "restarting its workers in place after a failure) that the operator has "
                                "counted, for this epoch.")
    left_out: list[str] = Field(default_factory=list, description="Uids of running pods whose agent the operator "
                                "took out of the rendezvous for its silence and left running (the store's word "
                                "alone): a round that forms does not wait for them, until their agent is in the "
                                "store again or the pod is gone.")
    refused_peers: int = Field(0, description="Connections the store's port refused since it started, as last "
                               "counted: peers that are not the job's pods (the store answers only the "
                               "addresses the operator names; a Warning Event StorePeerRefused names them).")


class OwnedPod(Model):
    """A pod name this job's operator made, and which of its makings is the one that counts."""

    name: str = Field(description="The pod's name.")
    serial: int = Field(description="Which making of this name is current: each pod the operator makes under "
                        "the name gets the next number, in its annotation elasticjob.dev/serial and signed "
                        "with it in elasticjob.dev/mark; a pod of the name with another serial is not the job's.")
    uid: str = Field("", description="The uid of that making once seen; empty until then.")
    key: str = Field("", description="Which operator key signed it (a fingerprint): after the key changed, the "
                     "record alone vouches for the pod.")


@dataclass(frozen=True)
class StatusPart:
    """An integration's own part of the job's status, under its own key (Kueue's `admission`): its model, which
    only the integration reads and writes, and the `kubectl get` columns that show it, each after the column it
    names. The core's status keeps the part as it is (ElasticJobStatus allows keys of its own); the CRD carries its
    schema and columns (crd.py, given the parts by the registry of integrations)."""

    key: str
    model: type[Model]
    description: str
    columns: tuple[tuple[str, dict[str, Any]], ...] = ()  # (the column it follows, the column)


class ElasticJobStatus(Model):
    """What the operator observed and did: the job's phase, its workers, restarts and failures, its rendezvous
    store, and each integration's own part (StatusPart: kept here unread, under the integration's key). Written by
    the operator."""

    # An integration's part is a key this model does not declare: kept, not dropped (the CRD's schema names it).
    model_config = ConfigDict(extra="allow")  # merged with Model's (camelCase aliases)

    phase: Phase = Field(Phase.PENDING, description="Pending (waiting for the store or for minReplicas ready "
                         "workers), Running, Restarting (failed workers being replaced), Succeeded, Failed, "
                         "Suspended (runPolicy.suspend) or Queued (waiting for Kueue to admit the job).")
    reason: str | None = Field(None, description="Why the job is in its phase, one CamelCase word: e.g. Waiting, "
                               "StoreComingBack, Completing, MaxRestartsExceeded, FatalExitCode, InvalidSpec, "
                               "DeadlineExceeded, Queued.")
    message: str | None = Field(None, description="Why, in words: what the job waits for, how many workers run "
                                "or cannot start and why, or what to fix.")
    conditions: list[Condition] = Field(default_factory=list, description="The job's conditions, one per type.")
    replicas: int = Field(0, description="Worker pods that exist and are not terminating.")
    ready_replicas: int = Field(0, description="Workers in the training: pods not being deleted whose containers "
                                "all run and are ready, less those whose agent the operator took out of the "
                                "rendezvous (the READY column). Through the operator's kit a worker is ready only "
                                "while its agent is in the rendezvous and hears from the store.")
    spares: int = Field(0, description="Warm spares (spec.spares): worker pods whose agent waits, ready, for a seat "
                        "in the job's rounds, as the store reports them. They are not in READY.")
    desired_spares: int = Field(0, description="Warm spare pods the operator wants now: spec.spares, less those "
                                "Kueue did not admit beyond the workers.")
    desired_replicas: int = Field(0, description="Worker pods the operator wants now: spec.replicas (else "
                                  "maxReplicas), at most the workers Kueue admitted.")
    restarts: int = Field(0, description="Worker-group restarts charged to maxRestarts; failures seen "
                          "together count once.")
    infrastructure_failures: int = Field(0, description="Pods lost to evictions, preemptions, lost "
                                         "nodes and partitions (not charged unless failurePolicy says so).")
    last_failures: list[FailureRecord] = Field(default_factory=list, description="The last 10 failures the "
                                               "operator saw, oldest first.")
    counted_failures: list[str] = Field(default_factory=list, description="UIDs of failed pods already "
                                        "counted, kept while the pod exists: no failure is counted twice, "
                                        "however long its pod takes to go.")
    avoided_nodes: list[AvoidedNode] = Field(default_factory=list, description="Nodes the job's next pods "
                                             "avoid after failures there (failurePolicy.avoidNodeSeconds), "
                                             "oldest first.")
    straggler: Straggler | None = Field(None, description="A worker pod slower than the others "
                                        "(spec.stragglers), while it is; absent otherwise.")
    last_restart_time: str | None = Field(None, description="When the last restart charged to maxRestarts "
                                          "happened (RFC 3339, UTC); pod failures close to it count as the same "
                                          "incident.")
    owned_pods: list[OwnedPod] | None = Field(None, description="The pods the operator made for this job, per "
                                             "name: only those count. Absent for a job an earlier operator "
                                             "version started (its pods count by their owner reference).")
    rendezvous: RendezvousStatus = Field(default_factory=RendezvousStatus, description="The job's rendezvous "
                                         "store, as the operator sees it.")
    renamed: dict[str, str] | None = Field(None, description="Names that someone else's object held when the "
                                           "operator went to make the job's object (Kind/name), each with the "
                                           "name it used instead: the usual one and a random suffix.")
    planned_stop: PlannedStop | None = Field(None, description="The planned stop under way (runPolicy."
                                             "stopGraceSeconds), if any.")
    last_stop: str | None = Field(None, description="The store's id of the last planned stop settled: a stop "
                                  "a worker's agent asked on SIGTERM is taken up once.")
    goodput: GoodputStatus | None = Field(None, description="The downtime ledger: goodput (ETTR) and the last "
                                          "incidents with the seconds lost per phase; absent until the job "
                                          "first runs.")
    start_time: str | None = Field(None, description="When the job last started running (RFC 3339, UTC): "
                                   "runPolicy.activeDeadlineSeconds counts from it. Cleared while the job is "
                                   "suspended or queued.")
    completion_time: str | None = Field(None, description="When the job succeeded or failed (RFC 3339, UTC): "
                                        "runPolicy.ttlSecondsAfterFinished counts from it.")
    observed_generation: int | None = Field(None, description="The job's metadata.generation the operator last "
                                            "acted on.")
    selector: str | None = Field(None, description="Label selector of the worker pods (scale subresource).")
