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


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class RendezvousSpec(Model):
    """The per-job c10d rendezvous store and the agents' rendezvous timeouts.

    Defaults come from measurements (shared notes): torch's own 30 s last call dominates start-up whenever
    fewer than max nodes run, and 2 s x 3 keep-alives recover from a lost node in ~9 s where 1 s x 2 caused
    split brain under CPU load.
    """

    port: int = Field(29400, ge=1, le=65534, description="Port of the rendezvous Service and store; the next "
                      "port serves the rendezvous state (round, nodes) to the operator.")
    image: str | None = Field(None, description="Image of the rendezvous pod; defaults to the worker image "
                              "(it must hold the same torch version as the agents).")
    join_timeout_seconds: int = Field(600, ge=1, le=86400,
                                      description="How long agents wait for minReplicas nodes to join.")
    last_call_timeout_seconds: int = Field(2, ge=0, le=3600, description="Extra wait for more nodes once "
                                           "minReplicas have joined (torch's default 30 s slows every start).")
    close_timeout_seconds: int = Field(10, ge=1, le=3600)
    keep_alive_interval_seconds: int = Field(2, ge=1, le=600, description="Agent heartbeat interval; with "
                                             "keepAliveMaxAttempts it sets how fast a lost node is noticed.")
    keep_alive_max_attempts: int = Field(3, ge=2, le=100, description="Missed heartbeats before a node is "
                                         "declared dead (below 2 risks split brain under load).")
    read_timeout_seconds: int = Field(60, ge=5, le=3600, description="Timeout of rendezvous store operations.")


class FailurePolicy(Model):
    fatal_exit_codes: list[int] = Field(default_factory=list, max_length=64, description=(
        "Worker exit codes that fail the job at once (no pod is replaced), e.g. a configuration error. "
        "Other non-zero exits restart the group within maxRestarts."))
    count_infrastructure_failures: bool = Field(False, description=(
        "Whether evictions, preemptions and lost nodes consume maxRestarts (by default they are recorded "
        "but not charged to the job)."))


class CleanPodPolicy(StrEnum):
    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class RunPolicy(Model):
    suspend: bool = Field(False, description="Delete all pods and keep the job; resume by setting false.")
    active_deadline_seconds: int | None = Field(None, ge=1, description="Fail the job once it has been "
                                                "running this long.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Delete the job this long "
                                                   "after it succeeded or failed.")
    clean_pod_policy: CleanPodPolicy = Field(CleanPodPolicy.RUNNING, description="Which pods to delete when "
                                             "the job finishes: All, Running (default) or None.")


class WatchdogSpec(Model):
    """torch elastic expiration timers: a rank that blocks past its deadline is killed by its agent."""

    enabled: bool = False
    step_timeout_seconds: int = Field(300, ge=1, le=86400, description="Deadline the training script passes "
                                      "to torch.distributed.elastic.timer.expires "
                                      "(env ELASTICJOB_STEP_TIMEOUT_SECONDS).")


class GangMode(StrEnum):
    NONE = "None"
    WORKLOAD = "Workload"  # the upstream Workload API: scheduling.k8s.io/v1alpha2 PodGroup
    COSCHEDULING = "Coscheduling"  # scheduler-plugins: scheduling.x-k8s.io/v1alpha1 PodGroup


class SchedulingSpec(Model):
    """Gang scheduling of the workers: minReplicas of them start together or not at all; more join one by one.
    The rendezvous store pod stays outside the gang (it must run first and holds no accelerator)."""

    gang: GangMode = Field(GangMode.NONE, description="None; Workload: a scheduling.k8s.io/v1alpha2 PodGroup "
                           "(Kubernetes 1.36, GenericWorkload and GangScheduling gates) with gang.minCount = "
                           "minReplicas; Coscheduling: a scheduler-plugins scheduling.x-k8s.io/v1alpha1 PodGroup "
                           "with minMember = minReplicas.")
    scheduler_name: str | None = Field(None, max_length=253, description="Scheduler of the job's pods with "
                                       "Coscheduling; default scheduler-plugins-scheduler (or the template's "
                                       "schedulerName).")
    schedule_timeout_seconds: int | None = Field(None, ge=1, le=86400, description="Coscheduling: how long a "
                                                 "gang may wait at Permit for its minMember (PodGroup "
                                                 "scheduleTimeoutSeconds). The Workload API waits 5 minutes.")


class ElasticJobSpec(Model):
    min_replicas: int = Field(1, ge=1, le=MAX_NODES, description="Fewest nodes (pods) training runs with.")
    max_replicas: int = Field(ge=1, le=MAX_NODES, description="Most nodes (pods) training runs with.")
    replicas: int | None = Field(None, ge=1, le=MAX_NODES, description="Desired nodes; defaults to "
                                 "maxReplicas. kubectl scale and HPAs set it through the scale subresource.")
    nproc_per_node: int | Literal["auto"] = Field("auto", description="Worker processes per pod: an integer, "
                                                  "or auto = the GPUs the worker container requests, else 1.")
    max_restarts: int = Field(3, ge=0, le=10000, description="How often the worker group may be restarted "
                              "after failures before the job fails.")
    warm_starts: bool = Field(True, description="Run torchrun through elasticjob_warm, copied into each pod by an "
                              "init container from the operator's image: workers are forked from a process that "
                              "imported torch, and agents read the rendezvous every 0.1 s. Works with any image "
                              "that has Python and torch, for `torchrun ...`, `python -m torch.distributed.run "
                              "...` and shell commands that run torchrun; other commands run as written, and the "
                              "WarmStarts condition says why. false: the command runs as written.")
    checkpoint_dir: str | None = Field(None, description="Passed to workers as ELASTICJOB_CHECKPOINT_DIR; "
                                       "mount shared storage there in the template.")
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
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
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class FailureRecord(Model):
    """One worker pod that ended badly, as the operator saw it."""

    pod: str
    uid: str
    replica_index: int | None = None
    exit_code: int | None = Field(None, description="The worker's exit code when the agent reported it, "
                                  "else the container's.")
    reason: str = Field(description="Error, OOMKilled, Killed, Evicted, Preempted, NodeLost, RendezvousLost, "
                        "FatalExitCode, MaxRestartsExceeded.")
    message: str = ""
    charged: bool = Field(True, description="Whether it consumed the restart budget.")
    time: str | None = None


class RendezvousStatus(Model):
    endpoint: str | None = Field(None, description="ClusterIP:port the agents rendezvous at.")
    run_id: str | None = None
    pod: str | None = None
    ready: bool = False
    round: int | None = Field(None, description="torch's rendezvous round: how often the worker group has "
                              "(re)formed, counting torchrun's in-place restarts and membership changes.")
    nodes: int | None = Field(None, description="Nodes (agents) in the current round.")
    restarts: int = Field(0, description="Times the rendezvous pod was lost and recreated.")
    last_lost_time: str | None = None
    service_uid: str | None = Field(None, description="The uid of the rendezvous Service the operator made, once "
                                    "seen: only that Service counts (another of its name is replaced).")
    epoch: str | None = Field(None, description="Identity of the store process whose counters failureRounds "
                              "refers to; a new store starts counting from zero.")
    failure_rounds: int = Field(0, description="Rounds the store saw re-formed by the same nodes (torchrun "
                                "restarting its workers in place after a failure) that the operator has "
                                "counted, for this epoch.")


class OwnedPod(Model):
    """A pod name this job's operator made, and which of its makings is the one that counts."""

    name: str
    serial: int = Field(description="Which making of this name is current: each pod the operator makes under "
                        "the name gets the next number, signed with it (see planner/ownership.py).")
    uid: str = Field("", description="The uid of that making once seen; empty until then.")
    key: str = Field("", description="Which operator key signed it (a fingerprint): after the key changed, the "
                     "record alone vouches for the pod.")


class AdmissionStatus(Model):
    """Admission by Kueue, for a job labelled kueue.x-k8s.io/queue-name."""

    workload: str | None = Field(None, description="The Kueue Workload the operator made for the job.")
    cluster_queue: str | None = None
    state: str | None = Field(None, description="Queued, Admitted, Preempted, Evicted or Finished.")
    message: str | None = Field(None, description="Kueue's words: why it waits, or why it was evicted.")
    workers: int | None = Field(None, description="Workers admitted (podSetAssignments count): the most "
                                "that run until the job is queued again.")
    flavors: dict[str, str] | None = Field(None, description="Resource flavor per resource of the workers.")
    requested: int | None = Field(None, description="Workers asked of Kueue in a workload slice it has not "
                                  "admitted yet; the job runs `workers` until it does.")
    template_hash: str | None = Field(None, description="Hash of the spec.template the Workload charges (made "
                                      "from). A job whose template differs runs no pod of it on that "
                                      "admission: it is requeued with a new Workload.")
    last_transition_time: str | None = None


class ElasticJobStatus(Model):
    phase: Phase = Phase.PENDING
    reason: str | None = None
    message: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int = Field(0, description="Worker pods that exist and are not terminating.")
    ready_replicas: int = 0
    desired_replicas: int = 0
    restarts: int = Field(0, description="Worker-group restarts charged to maxRestarts; failures seen "
                          "together count once.")
    infrastructure_failures: int = Field(0, description="Pods lost to evictions, preemptions and lost "
                                         "nodes (not charged unless failurePolicy says so).")
    last_failures: list[FailureRecord] = Field(default_factory=list)
    counted_failures: list[str] = Field(default_factory=list, description="UIDs of failed pods already "
                                        "counted, kept while the pod exists: no failure is counted twice, "
                                        "however long its pod takes to go.")
    last_restart_time: str | None = None
    owned_pods: list[OwnedPod] | None = Field(None, description="The pods the operator made for this job, per "
                                             "name: only those count. Absent for a job started before pods "
                                             "were signed.")
    rendezvous: RendezvousStatus = Field(default_factory=RendezvousStatus)
    renamed: dict[str, str] | None = Field(None, description="Names an object that is not the job's held when the "
                                           "operator asked for them (Kind/name), and the name it made the job's "
                                           "object under instead: the usual one and a random suffix.")
    admission: AdmissionStatus | None = None
    start_time: str | None = None
    completion_time: str | None = None
    observed_generation: int | None = None
    selector: str | None = Field(None, description="Label selector of the worker pods (scale subresource).")
