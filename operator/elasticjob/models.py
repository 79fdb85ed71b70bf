"""The ElasticJob API: pydantic models are the one source of truth.

The CRD schema in crds/ and the chart is generated from these classes (see crd.py); a test fails when they drift.
The v1alpha1 spec only grows by optional fields: kopf has no conversion webhooks.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "elasticjob.dev"
VERSION = "v1alpha1"
KIND = "ElasticJob"
PLURAL = "elasticjobs"
SINGULAR = "elasticjob"
SHORT_NAMES = ["ej"]
API_VERSION = f"{GROUP}/{VERSION}"

# The most nodes one job may ask for; it also bounds the cost of the CEL rules.
MAX_NODES = 1024
MAX_FAILURES_KEPT = 10
MAX_INCIDENTS_KEPT = 5


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class RendezvousSpec(Model):
    """The per-job c10d rendezvous store and the agents' rendezvous timeouts.

    The defaults are measured on torch 2.13: torch's own 30 s last call dominates start-up whenever fewer than
    max nodes run, and 2 s x 3 keep-alives recover from a lost node in about 9 s where 1 s x 2 caused split
    brain under CPU load.
    """

    port: int = Field(29400, ge=1, le=65534, description="Port of the rendezvous Service and store; the next "
                      "port serves the rendezvous state (round, nodes) to the operator. Default 29400.")
    image: str | None = Field(None, description="Image of the rendezvous pod; defaults to the worker image "
                              "(it must hold the same torch version as the agents).")
    join_timeout_seconds: int = Field(600, ge=1, le=86400, description="Seconds agents wait for minReplicas "
                                      "nodes to join a round, and for a lost store to come back, before they "
                                      "give up. Default 600.")
    last_call_timeout_seconds: int = Field(2, ge=0, le=3600, description="Seconds agents wait for more nodes "
                                           "once minReplicas have joined; the operator ends the wait as soon as "
                                           "every running worker's agent is in (torch's own default of 30 s "
                                           "slows every start). Default 2.")
    close_timeout_seconds: int = Field(10, ge=1, le=3600, description="Seconds an agent may take to mark the "
                                       "rendezvous closed (it then takes no more nodes) when torchrun exits. "
                                       "Default 10.")
    keep_alive_interval_seconds: int = Field(2, ge=1, le=600, description="Seconds between an agent's "
                                             "heartbeats; times keepAliveMaxAttempts, how fast a lost node is "
                                             "noticed. Default 2.")
    keep_alive_max_attempts: int = Field(3, ge=2, le=100, description="Missed heartbeats before a node is "
                                         "declared dead (at least 2: fewer caused split brain under load). "
                                         "Default 3.")
    read_timeout_seconds: int = Field(60, ge=5, le=3600, description="Seconds an agent waits for one "
                                      "operation of the rendezvous store. Default 60.")


class FailurePolicy(Model):
    """Which worker failures fail the job at once, and which count against maxRestarts."""

    fatal_exit_codes: list[int] = Field(default_factory=list, max_length=64, description=(
        "Worker exit codes that fail the job at once (no pod is replaced), e.g. a configuration error. "
        "Other non-zero exits restart the group within maxRestarts. Default none."))
    count_infrastructure_failures: bool = Field(False, description=(
        "Whether evictions, preemptions, lost nodes and partitions consume maxRestarts (by default they are "
        "recorded but not charged to the job). Default false."))


class CleanPodPolicy(StrEnum):
    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class RunPolicy(Model):
    """Suspending the job, its deadline, and what becomes of it and its pods once it finished."""

    suspend: bool = Field(False, description="true deletes all pods and keeps the job (phase Suspended); "
                          "false resumes it from its checkpoint. Default false.")
    active_deadline_seconds: int | None = Field(None, ge=1, description="Seconds the job may run, counted from "
                                                "its last start (status.startTime); then it fails with reason "
                                                "DeadlineExceeded and its pods are stopped. Unset: no limit.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Seconds after the job succeeded "
                                                   "or failed (status.completionTime) that the operator deletes "
                                                   "it. Unset: the job is kept.")
    stop_grace_seconds: int = Field(30, ge=0, le=3600, description="Planned stops: before the operator removes "
                                    "workers it chose to remove (a scale-down, runPolicy.suspend, Kueue's "
                                    "preemption or eviction), a training that asks elasticjob_progress's "
                                    "should_stop() is told to stop after a step all ranks agree on and save it; "
                                    "the pods go once every rank said so, or after this many seconds at most "
                                    "(then as without it). On an eviction or a node drain the worker's agent "
                                    "asks for the same stop before torchrun stops the workers; worker pods whose "
                                    "template sets no terminationGracePeriodSeconds get one covering it and "
                                    "torchrun's own 30 s. 0: never ask. A script that never asks is not waited "
                                    "for. Default 30.")
    clean_pod_policy: CleanPodPolicy = Field(CleanPodPolicy.RUNNING, description="Which pods to delete when "
                                             "the job finishes: All, Running (those still running, and the "
                                             "rendezvous store and Service) or None (keep them all). Default "
                                             "Running.")


class WatchdogSpec(Model):
    """torch elastic expiration timers: a rank that blocks past its deadline is killed by its agent."""

    enabled: bool = Field(False, description="Run torch elastic's file-based timer server in each agent: a "
                          "worker rank whose expires() deadline passes is killed, and the group restarts from its "
                          "checkpoint (charged like any worker failure). Default false.")
    step_timeout_seconds: int = Field(300, ge=1, le=86400, description="Deadline the training script passes "
                                      "to torch.distributed.elastic.timer.expires "
                                      "(env ELASTICJOB_STEP_TIMEOUT_SECONDS), in seconds. Default 300.")


class KitSource(StrEnum):
    COPY = "Copy"  # an init container copies the kit from the operator's image into each job pod
    IMAGE = "Image"  # the job's image carries the kit's packages: no init container


class GangMode(StrEnum):
    NONE = "None"
    WORKLOAD = "Workload"  # the upstream Workload API: scheduling.k8s.io/v1alpha2 PodGroup
    COSCHEDULING = "Coscheduling"  # scheduler-plugins: scheduling.x-k8s.io/v1alpha1 PodGroup


class SchedulingSpec(Model):
    """Gang scheduling of the workers: minReplicas of them start together or not at all; more join one by one.
    The rendezvous store pod stays outside the gang (it must run first and holds no accelerator)."""

    gang: GangMode = Field(GangMode.NONE, description="How minReplicas workers are bound together. "
                           "None: not at all; Workload: a scheduling.k8s.io/v1alpha2 PodGroup "
                           "(Kubernetes 1.36, GenericWorkload and GangScheduling gates) with gang.minCount = "
                           "minReplicas; Coscheduling: a scheduler-plugins scheduling.x-k8s.io/v1alpha1 PodGroup "
                           "with minMember = minReplicas. Default None.")
    scheduler_name: str | None = Field(None, max_length=253, description="Scheduler of the job's pods with "
                                       "Coscheduling; default scheduler-plugins-scheduler (or the template's "
                                       "schedulerName). Ignored by the other gang modes.")
    schedule_timeout_seconds: int | None = Field(None, ge=1, le=86400, description="Coscheduling: how long a "
                                                 "gang may wait at Permit for its minMember (PodGroup "
                                                 "scheduleTimeoutSeconds), in seconds; unset: the plugin's "
                                                 "default. The Workload API waits 5 minutes.")


class ElasticJobSpec(Model):
    """What the job runs and how: the worker pod template, how many nodes (pods) it may run on, and how its
    rendezvous, failures, lifetime and scheduling are handled."""

    min_replicas: int = Field(1, ge=1, le=MAX_NODES, description="Fewest nodes (pods) training runs with. "
                              "Default 1.")
    max_replicas: int = Field(ge=1, le=MAX_NODES, description="Most nodes (pods) training runs with.")
    replicas: int | None = Field(None, ge=1, le=MAX_NODES, description="Desired nodes; defaults to "
                                 "maxReplicas. kubectl scale and HPAs set it through the scale subresource.")
    nproc_per_node: int | Literal["auto"] = Field("auto", description="Worker processes per pod: an integer, "
                                                  "or auto = the GPUs the worker container requests, else 1. "
                                                  "Default auto.")
    max_restarts: int = Field(3, ge=0, le=10000, description="How often the worker group may be restarted "
                              "after failures before the job fails. Default 3.")
    warm_starts: bool = Field(True, description="Run torchrun through elasticjob_warm, copied into each pod by an "
                              "init container from the operator's image: workers are forked from a process that "
                              "imported torch, and agents read the rendezvous every 0.1 s. Works with any image "
                              "that has Python and torch, for `torchrun ...`, `python -m torch.distributed.run "
                              "...` and shell commands that run torchrun; other commands run as written, and the "
                              "WarmStarts condition says why. false: the command runs as written. Default true.")
    kit: KitSource = Field(KitSource.COPY, description="Where the job's pods get the operator's kit (the "
                           "rendezvous store, warm starts, the progress API). Copy: an init container copies it "
                           "from the operator's image into each pod, so any image with Python and torch works. "
                           "Image: the job's image carries elasticjob_store, elasticjob_warm, elasticjob_progress "
                           "and elasticjob_ckpt on its PYTHONPATH at the operator's version, as the project's "
                           "worker images do: no init container, one container fewer to start in every pod (a "
                           "fleet starts faster); the store runs `python -m elasticjob_store` and torchrun runs "
                           "as `python -m elasticjob_warm.torchrun` (a shell's torchrun then runs as written). "
                           "Default Copy.")
    checkpoint_dir: str | None = Field(None, description="Passed to workers as ELASTICJOB_CHECKPOINT_DIR; "
                                       "mount shared storage there in the template.")
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec, description="The job's rendezvous: the "
                                       "c10d store pod the operator runs for it, and the timeouts torchrun's "
                                       "agents use to form the worker group. All optional.")
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy, description="Which worker failures "
                                          "fail the job at once, and which count against maxRestarts.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Suspending the job, its deadline, "
                                  "and what becomes of it and its pods once it finished.")
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec, description="torch elastic's expiration "
                                   "timers: a worker rank that blocks past its step deadline is killed by its "
                                   "agent.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Gang scheduling of the "
                                       "workers: minReplicas of them start together or not at all.")
    template: dict[str, Any] = Field(description="Pod template of a worker (a PodTemplateSpec). Its container "
                                     "named 'worker' (or the first) runs torchrun.")

    @property
    def desired_replicas(self) -> int:
        return self.replicas if self.replicas is not None else self.max_replicas


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
    epoch: str | None = Field(None, description="Identity of the store process whose counters failureRounds "
                              "refers to; a new store starts counting from zero.")
    failure_rounds: int = Field(0, description="Rounds the store saw re-formed by the same nodes (torchrun "
                                "restarting its workers in place after a failure) that the operator has "
                                "counted, for this epoch.")


class OwnedPod(Model):
    """A pod name this job's operator made, and which of its makings is the one that counts."""

    name: str = Field(description="The pod's name.")
    serial: int = Field(description="Which making of this name is current: each pod the operator makes under "
                        "the name gets the next number, in its annotation elasticjob.dev/serial and signed "
                        "with it in elasticjob.dev/mark; a pod of the name with another serial is not the job's.")
    uid: str = Field("", description="The uid of that making once seen; empty until then.")
    key: str = Field("", description="Which operator key signed it (a fingerprint): after the key changed, the "
                     "record alone vouches for the pod.")


class AdmissionStatus(Model):
    """Admission by Kueue, for a job labelled kueue.x-k8s.io/queue-name."""

    workload: str | None = Field(None, description="The Kueue Workload the operator made for the job.")
    cluster_queue: str | None = Field(None, description="The Kueue ClusterQueue that admitted the job.")
    state: str | None = Field(None, description="Queued, Admitted, Preempted, Evicted or Finished.")
    message: str | None = Field(None, description="Kueue's words: why it waits, or why it was evicted.")
    workers: int | None = Field(None, description="Workers admitted (podSetAssignments count): the most "
                                "that run until the job is queued again.")
    flavors: dict[str, str] | None = Field(None, description="Resource flavor per resource of the workers.")
    requested: int | None = Field(None, description="Workers asked of Kueue in a workload slice it has not "
                                  "admitted yet; the job runs `workers` until it does.")
    template_hash: str | None = Field(None, description="Hash of the spec.template the Kueue Workload was "
                                      "made from, the one its quota charges. A job whose template differs "
                                      "runs no pod of it on that admission: it is requeued with a new "
                                      "Workload.")
    last_transition_time: str | None = Field(None, description="When state last changed (RFC 3339, UTC).")


class LostPhases(Model):
    """Where one incident's seconds went. Null: not seen (the phases after the round need the training's progress
    reports, elasticjob_progress), never zero."""

    detect: float | None = Field(None, description="From the fault to the operator seeing it.")
    replace: float | None = Field(None, description="Until every wanted worker pod was scheduled and running "
                                  "again (0 when no pod was replaced).")
    rendezvous: float | None = Field(None, description="Until the store reported the worker group re-formed.")
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
                      "Partition, StoreLost, ScaleChange, Preemption or Suspend.")
    reason: str = Field("", description="What the operator saw: a failure's reason (Error, Killed, Evicted, "
                        "...), StoreLost, ScaleUp or ScaleDown, Preempted.")
    pod: str | None = Field(None, description="The pod it happened to, if one.")
    start_time: str = Field(description="When the fault happened, as far as the operator can tell (a "
                            "container's end, the store's loss, the scale change) (RFC 3339, UTC).")
    detected_time: str | None = Field(None, description="When the operator saw it.")
    replaced_time: str | None = Field(None, description="When every wanted worker ran again.")
    round_time: str | None = Field(None, description="When the store reported the group re-formed.")
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


class GoodputStatus(Model):
    """The job's downtime ledger: how much of its wall time trained (ETTR, goodput), and where the rest went."""

    since: str | None = Field(None, description="When the ledger started: the job's first Running (RFC 3339).")
    wall_seconds: float = Field(0.0, description="Seconds from `since` to the last incident's close (the ledger "
                                "is written when an incident opens or closes, not every second).")
    lost_seconds: float = Field(0.0, description="Training seconds lost in closed incidents, over all phases "
                                "seen.")
    goodput_percent: float | None = Field(None, description="100 x (wallSeconds - lostSeconds) / wallSeconds: "
                                          "the share of wall time spent training (ETTR); null before any incident "
                                          "closed.")
    incidents: int = Field(0, description="Incidents closed.")
    progress_reported: bool = Field(False, description="Whether the training reports its steps "
                                    "(elasticjob_progress): without it the phases after the round are null.")
    open_incident: Incident | None = Field(None, description="The incident being recovered from, if any.")
    last_incidents: list[Incident] = Field(default_factory=list, description="The last 5 closed incidents, "
                                           "oldest first.")


class ElasticJobStatus(Model):
    """What the operator observed and did: the job's phase, its workers, restarts and failures, its rendezvous
    store and its admission by Kueue. Written by the operator."""

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
    ready_replicas: int = Field(0, description="Worker pods not being deleted whose containers all run and are "
                                "ready (the READY column).")
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
    admission: AdmissionStatus | None = Field(None, description="Admission by Kueue, for a job labelled "
                                              "kueue.x-k8s.io/queue-name; absent otherwise.")
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
