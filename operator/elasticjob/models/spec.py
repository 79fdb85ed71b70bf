"""The ElasticJob's spec: what the user asks for."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from elasticjob.models.base import MAX_NODES, MAX_SPARES, Model


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
    keep_alive_interval_seconds: int = Field(1, ge=1, le=600, description="Seconds between an agent's "
                                             "heartbeats. The operator takes an agent out once it missed one "
                                             "(1.5 intervals) while the training reports no step, or its pod or "
                                             "node is not Ready: how fast a partition or a lost node is noticed. "
                                             "Each heartbeat rewrites torch's whole rendezvous state in the store, "
                                             "so jobs of hundreds of nodes may want a few seconds. Default 1.")
    keep_alive_max_attempts: int = Field(5, ge=2, le=100, description="Missed heartbeats before torch's agents "
                                         "declare a node dead on their own, whatever the training does (at "
                                         "least 2: fewer caused split brain under load). Default 5.")
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
    avoid_node_seconds: int = Field(600, ge=0, le=604800, description=(
        "Seconds a node stays avoided by this job's next pods (a required node affinity) after a failure the "
        "operator attributes to it: a worker that failed there (its pod, or an in-place restart its agent "
        "logged), or a pod cut off from the network there. Further failures on an avoided node are one incident "
        "with the first and cost no restart; status.avoidedNodes lists them. Counted from the first failure: "
        "lowering it (0: off) ends the avoidance at the next reconcile. Default 600."))


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


class NodeCheckSpec(Model):
    """The kit's check of a node before its agent joins a round (elasticjob_warm/nodecheck.py)."""

    enabled: bool = Field(True, description="Before a worker's agent joins the rendezvous, check its node: a "
                          "matmul whose result is known on the CPU and on each GPU the pod sees, and an all-reduce "
                          "across those GPUs. A node that fails (a wrong result, a CUDA error, a check past "
                          "timeoutSeconds) fails the pod with reason NodeCheckFailed, not charged to maxRestarts "
                          "(unless failurePolicy.countInfrastructureFailures), and the job avoids the node "
                          "(failurePolicy.avoidNodeSeconds). Runs where torchrun runs through the kit, beside the "
                          "warm server's import. Default true.")
    timeout_seconds: int = Field(30, ge=1, le=3600, description="Seconds the check may take before the node is "
                                 "taken for too slow and fails it. Default 30.")
    link_probe: bool = Field(True, description="Once a round of 3 or more agents forms, before the workers start, "
                             "the agents measure the link between every pair of them (gloo over TCP: latency and "
                             "bandwidth). The agent whose every link is linkFactor times "
                             "slower than the median agent's is replaced through a planned stop (Event "
                             "SlowLinkReplaced, not charged) and its node avoided (reason SlowLink). Runs where "
                             "torchrun runs through the kit. Default true.")
    link_factor: float = Field(3.0, ge=1.5, le=100.0, description="How many times slower than the median agent's "
                               "an agent's best link must be (bandwidth, or round-trip latency) to be replaced. "
                               "Default 3.")


class StragglerSpec(Model):
    """Replacing a worker whose ranks are slower than the others' (planner/stragglers.py)."""

    enabled: bool = Field(True, description="Replace a worker pod whose model forward takes `factor` times the "
                          "median of the other pods' for `windowSeconds`: its node is avoided "
                          "(failurePolicy.avoidNodeSeconds, reason SlowNode) and the pod is deleted, which a "
                          "training that asks elasticjob_progress's should_stop() takes as a planned stop (every "
                          "rank saves the same step). Never charged to maxRestarts. Needs every rank to call "
                          "elasticjob_progress's Progress.watch(model): without it there is nothing to compare. "
                          "Default true.")
    factor: float = Field(2.0, ge=1.5, le=100.0, description="How many times the median of the other pods' "
                          "forward time a pod's must be to be slow (at least 1.5: below it, a shared node's noise "
                          "would replace pods). Default 2.")
    window_seconds: int = Field(15, ge=5, le=86400, description="Seconds a pod must stay that slow before it is "
                                "replaced. Default 15.")


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
    spares: int = Field(0, ge=0, le=MAX_SPARES, description="Warm spare pods beside the workers: started like "
                        "them (the kit, torch imported, the node checked) but outside the training, each waiting "
                        "for a seat in the job's rounds. When a worker's pod is lost, cut off, replaced or slow, a "
                        "spare takes its place in the next round, so the job restarts once, at its full size, and "
                        "the replacement pod becomes the next spare. They count against quota like workers. Needs "
                        "warmStarts. Default 0.")
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
    node_check: NodeCheckSpec = Field(default_factory=NodeCheckSpec, description="The kit's check of each "
                                      "worker's node before its agent joins a round. All optional.")
    stragglers: StragglerSpec = Field(default_factory=StragglerSpec, description="Replacing a worker slower "
                                      "than the others. All optional.")
    template: dict[str, Any] = Field(description="Pod template of a worker (a PodTemplateSpec). Its container "
                                     "named 'worker' (or the first) runs torchrun.")

    @property
    def desired_replicas(self) -> int:
        return self.replicas if self.replicas is not None else self.max_replicas

    @property
    def desired_pods(self) -> int:
        """Worker pods the spec wants: its workers and its warm spares (what Kueue is asked to admit)."""
        return self.desired_replicas + self.spares
