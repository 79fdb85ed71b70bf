"""Pure views of observed pods and services: the few facts the planner decides on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from elasticjob import naming
from elasticjob.agent_messages import (
    NODE_CHECK_EXIT,
    RENDEZVOUS_EXIT,
    STOP_EXPIRED_EXIT,
    STORE_LOST,
    node_check_failure,
    parse_agent_message,
    rendezvous_failure,
)
from elasticjob.models import API_VERSION, KIND
from elasticjob.store_view import (  # the store's answer, seen beside the pods (re-exported: one place to look)
    LinksView,
    NodeCheckView,
    PaceView,
    PeersView,
    ProgressView,
    SeatsView,
    StoreNode,
    StoreView,
)

__all__ = ["DISRUPTION_REASONS", "LinksView", "NodeCheckView", "PaceView", "PeersView", "PodView", "ProgressView",
           "SeatsView", "ServiceView", "SliceView", "StoreNode", "StoreView", "WorkerPods", "pod_view", "service_view",
           "slice_view"]

# Pod-level reasons that mean "not the job's fault".
DISRUPTION_REASONS = {
    "Evicted": "Evicted",
    "Preempting": "Preempted",
    "NodeLost": "NodeLost",
    "NodeShutdown": "NodeLost",
    "Terminated": "NodeLost",
    "EvictionByEvictionAPI": "Evicted",
    "PreemptionByScheduler": "Preempted",
    "DeletionByTaintManager": "NodeLost",
    "DeletionByPodGC": "NodeLost",
    "TerminationByKubelet": "Evicted",
}


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    uid: str
    role: str
    index: int | None
    phase: str
    ready: bool = False  # the pod's Ready condition: what the store's serving and the recovery decide on
    # Every container of the pod runs and is ready, in the kubelet's own words (its container statuses): what the
    # job's READY counts. The pod's Ready condition is not only the kubelet's: the node lifecycle controller sets
    # it False on every pod of a node it has not heard from for a while (MarkPodsNotReady), containers running.
    containers_ready: bool = False
    # When the kubelet saw its containers turn not ready after its main container started (a readiness probe that
    # failed after it had passed); None: ready, or not ready yet since it started. See _lost_readiness.
    lost_ready_at: datetime | None = None
    deleting: bool = False
    deletion_time: datetime | None = None
    deletion_grace: int | None = None
    node: str | None = None
    unschedulable: str | None = None
    exit_code: int | None = None
    worker_exit_code: int | None = None
    agent_gave_up: bool = False
    says_store_lost: bool = False  # its log's tail says so: see STORE_LOST
    node_check_failed: str | None = None  # why the kit's node check failed (NODE_CHECK_EXIT and its line); None: not
    # The type of the rendezvous error that ended the kit's agent, no worker of it failed (RENDEZVOUS_EXIT and its
    # line); None: not
    rendezvous_failed: str | None = None
    reason: str | None = None
    message: str = ""
    disruption: str | None = None
    finished_at: datetime | None = None
    restarted_at: datetime | None = None  # when the container last ended and the kubelet started it again
    # The kubelet holds the container back (CrashLoopBackOff) after a signal ended it: a kill, not a bad start.
    killed_and_backed_off: bool = False
    # Why a container (an init container included: the kit's) cannot start, in the kubelet's words; None: none.
    cannot_start: str | None = None
    generation: int | None = None
    owner_uid: str | None = None
    ip: str | None = None
    started: bool = False
    serial: int | None = None  # which making of its name, and the operator's signature of it
    mark: str = ""

    @property
    def stop_expired(self) -> bool:
        """A worker of it held after a planned stop that nobody ended, and left with STOP_EXPIRED_EXIT."""
        return self.worker_exit_code == STOP_EXPIRED_EXIT

    @property
    def serving(self) -> bool:
        """Ready and not on its way out."""
        return self.ready and not self.deleting

    @property
    def active(self) -> bool:
        """Running or about to: counts towards the group."""
        return self.phase in ("Pending", "Running", "Unknown") and not self.deleting

    @property
    def exited_ok(self) -> bool:
        """Its main container exited 0: torchrun's agent finished, so training did. A real kubelet reports that
        exit (and Ready False) one status update before the pod's phase turns Succeeded; taking the pod for a
        worker merely not ready meanwhile showed a finishing job as Pending, waiting for workers."""
        return self.phase == "Succeeded" or self.exit_code == 0

    @property
    def ended(self) -> bool:
        """Its main container terminated (the kubelet gave an exit code, or an end time)."""
        return self.finished_at is not None or self.exit_code is not None

    @property
    def live(self) -> bool:
        """Its containers have not ended and it is not being deleted: whatever its phase, it may still act (an agent
        that wakes, a process that writes)."""
        return not self.ended and not self.deleting

    @property
    def running(self) -> bool:
        """Running, not leaving, its main container not ended (ready or not): a worker that trains or is about to
        rendezvous."""
        return self.active and self.phase == "Running" and not self.ended

    @property
    def failed(self) -> bool:
        """A failure to account for: the pod Failed, or evicted while leaving. A pod deleted on purpose (a
        scale-down, a suspension, a user) is none."""
        if self.deleting:
            return self.disruption is not None
        return self.phase == "Failed"

    @property
    def never_ran(self) -> bool:
        """Waiting for a node or for its containers to start: it has trained nothing and holds no rank."""
        return self.active and not self.started


@dataclass(frozen=True, slots=True)
class WorkerPods:
    """A job's worker pods sorted once by what they are doing (a pod is in every group whose test it passes), so
    that every policy counts the same pods. Built by Observed.by_state."""

    all: tuple[PodView, ...] = ()
    active: tuple[PodView, ...] = ()  # running or about to, not leaving: counts towards the group
    live: tuple[PodView, ...] = ()  # containers not ended, not leaving: may still act, whatever its phase
    running: tuple[PodView, ...] = ()  # Running, not leaving, not ended: trains, or is about to rendezvous
    never_ran: tuple[PodView, ...] = ()  # active, waiting for a node or its containers: trained nothing
    failed: tuple[PodView, ...] = ()  # a failure to account for, by name
    finished: bool = False  # one exited 0 (its phase Succeeded, or its exit seen first): the training finished

    @classmethod
    def of(cls, workers: list[PodView]) -> WorkerPods:
        return cls(all=tuple(workers), active=tuple(p for p in workers if p.active),
                   live=tuple(p for p in workers if p.live), running=tuple(p for p in workers if p.running),
                   never_ran=tuple(p for p in workers if p.never_ran),
                   failed=tuple(sorted((p for p in workers if p.failed), key=lambda p: p.name)),
                   finished=any(p.exited_ok for p in workers))


@dataclass(frozen=True, slots=True)
class ServiceView:
    name: str
    cluster_ip: str | None
    uid: str = ""
    owner_uid: str | None = None
    mark: str = ""
    selector: bool = False  # routes to pods by their labels, which anyone who may create pods can set
    serial: int = 0  # which making of the name it is (a Service made before serials were written has none: 0)


@dataclass(frozen=True, slots=True)
class SliceView:
    """An EndpointSlice naming a job's rendezvous Service (kubernetes.io/service-name): who made it, and where
    it sends the Service's connections."""

    name: str
    uid: str
    service: str
    addresses: tuple[str, ...] = ()
    # The Endpoints object (name, uid) the endpointslice-mirroring controller made it from, if it did.
    mirrored_from: tuple[str, str] | None = None


def parse_time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _main_container_status(status: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    statuses = status.get("containerStatuses") or []
    wanted = naming.WORKER_CONTAINER if role == naming.ROLE_WORKER else naming.RENDEZVOUS_CONTAINER
    return next((s for s in statuses if s.get("name") == wanted), statuses[0] if statuses else {})


def _disruption(status: Mapping[str, Any]) -> str | None:
    target = _condition(status, "DisruptionTarget")
    if target.get("status") == "True":
        return DISRUPTION_REASONS.get(target.get("reason", ""), "Evicted")
    return DISRUPTION_REASONS.get(status.get("reason") or "")



def pod_view(body: Mapping[str, Any]) -> PodView:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    labels = meta.get("labels") or {}
    role = labels.get(naming.ROLE_LABEL, "")
    index = labels.get(naming.INDEX_LABEL)
    main = _main_container_status(status, role)
    terminated = (main.get("state") or {}).get("terminated") or {}
    message = terminated.get("message") or ""
    # A container ended by a signal wrote no verdict: its message is the kubelet's copy of the log's tail
    # (FallbackToLogsOnError), where a heartbeat that once failed is history, not the cause.
    verdict = bool(terminated) and (terminated.get("exitCode") or 0) < 128
    gave_up, worker_exit = parse_agent_message(message) if verdict else (False, None)
    # Only an agent that gave up names the worker's code as its cause; otherwise the last "failed" line is an
    # in-place restart it survived, and the container's own exit code is the cause.
    if not gave_up or worker_exit is None:
        worker_exit = terminated.get("exitCode")
    scheduled = _condition(status, "PodScheduled")
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=role,
        index=int(index) if index is not None and str(index).isdigit() else None,
        phase=status.get("phase") or "Pending",
        ready=_condition(status, "Ready").get("status") == "True",
        containers_ready=_containers_ready(body),
        lost_ready_at=_lost_readiness(status, main),
        deleting=meta.get("deletionTimestamp") is not None,
        deletion_time=parse_time(meta.get("deletionTimestamp")),
        deletion_grace=meta.get("deletionGracePeriodSeconds"),
        node=(body.get("spec") or {}).get("nodeName"),
        unschedulable=scheduled.get("message") if scheduled.get("reason") == "Unschedulable" else None,
        exit_code=terminated.get("exitCode"),
        worker_exit_code=worker_exit,
        agent_gave_up=gave_up,
        says_store_lost=verdict and any(marker in message for marker in STORE_LOST),
        node_check_failed=node_check_failure(message) if terminated.get("exitCode") == NODE_CHECK_EXIT else None,
        rendezvous_failed=rendezvous_failure(message) if terminated.get("exitCode") == RENDEZVOUS_EXIT else None,
        reason=terminated.get("reason") or status.get("reason"),
        message=message or status.get("message") or "",
        disruption=_disruption(status),
        finished_at=parse_time(terminated.get("finishedAt")),
        restarted_at=parse_time(((main.get("lastState") or {}).get("terminated") or {}).get("finishedAt")),
        killed_and_backed_off=_killed_and_backed_off(main),
        cannot_start=_cannot_start(status),
        generation=_int((meta.get("annotations") or {}).get(naming.RESTART_GENERATION_ANNOTATION)),
        owner_uid=controller_uid(meta),
        ip=status.get("podIP"),
        started=_ever_started(status),
        serial=_int((meta.get("annotations") or {}).get(naming.SERIAL_ANNOTATION)),
        mark=(meta.get("annotations") or {}).get(naming.MARK_ANNOTATION) or "",
    )


# Waiting reasons of a container that will not start by waiting: the image, its configuration, the runtime.
CANNOT_START = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                "CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def clip(message: str, head: int = 120, tail: int = 280) -> str:
    """A long waiting message cut in its middle: a kubelet's pull error names the image first and the registry's
    answer (401 Unauthorized, not found) last, and the user needs both."""
    return message if len(message) <= head + tail else f"{message[:head]} ... {message[-tail:]}"


def _cannot_start(status: Mapping[str, Any]) -> str | None:
    for each in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (each.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            message = clip(waiting.get("message") or "")
            return f"container {each.get('name')}: {waiting['reason']}{': ' + message if message else ''}"
    return None


def _containers_ready(body: Mapping[str, Any]) -> bool:
    """The kubelet's ContainersReady, read from its container statuses: each container, and each sidecar (an init
    container that restarts Always), is running and ready (passes its readiness probe, or has none)."""
    status = body.get("status") or {}
    sidecars = {c.get("name") for c in (body.get("spec") or {}).get("initContainers") or []
                if c.get("restartPolicy") == "Always"}
    statuses = [*(status.get("containerStatuses") or []),
                *(s for s in status.get("initContainerStatuses") or [] if s.get("name") in sidecars)]
    return bool(statuses) and all(s.get("ready") is True and "running" in (s.get("state") or {}) for s in statuses)


def _lost_readiness(status: Mapping[str, Any], main: Mapping[str, Any]) -> datetime | None:
    """The ContainersReady condition's last change, where it turned False after the main container last started.
    The kubelet writes that condition False when the pod starts and keeps its time until it changes, so a
    container that has not been ready since it started has an older time (a restarted container, a newer start).
    The condition is the kubelet's alone: the node lifecycle controller marks a silent node's pods not Ready
    through the Ready condition, not this one."""
    condition = _condition(status, "ContainersReady")
    if condition.get("status") != "False":
        return None
    started = parse_time(((main.get("state") or {}).get("running") or {}).get("startedAt"))
    changed = parse_time(condition.get("lastTransitionTime"))
    return changed if started is not None and changed is not None and changed > started else None


def _killed_and_backed_off(main: Mapping[str, Any]) -> bool:
    waiting = (main.get("state") or {}).get("waiting") or {}
    last = (main.get("lastState") or {}).get("terminated") or {}
    return waiting.get("reason") == "CrashLoopBackOff" and (last.get("exitCode") or 0) >= 128


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the ElasticJob controlling the object: which job, of all that ever had this name, made it.
    Anyone who may create pods can write such a reference; see planner/ownership.py for what else counts."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid") if (ref.get("apiVersion"), ref.get("kind")) == (API_VERSION, KIND) else None
    return None


def _ever_started(status: Mapping[str, Any]) -> bool:
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    for container in status.get("containerStatuses") or []:
        state, last = container.get("state") or {}, container.get("lastState") or {}
        if "running" in state or "terminated" in state or "terminated" in last:
            return True
    return False


def _int(value: Any) -> int | None:
    return int(value) if value is not None and str(value).isdigit() else None


def service_view(body: Mapping[str, Any]) -> ServiceView:
    meta = body.get("metadata") or {}
    ip = (body.get("spec") or {}).get("clusterIP")
    return ServiceView(name=meta.get("name", ""), cluster_ip=ip if ip not in ("", "None") else None,
                       uid=meta.get("uid", ""), owner_uid=controller_uid(meta),
                       mark=(meta.get("annotations") or {}).get(naming.MARK_ANNOTATION) or "",
                       selector=bool((body.get("spec") or {}).get("selector")),
                       serial=_int((meta.get("annotations") or {}).get(naming.SERIAL_ANNOTATION)) or 0)


def slice_view(body: Mapping[str, Any]) -> SliceView:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    source = None
    if labels.get(naming.SLICE_MANAGER_LABEL) == naming.MIRRORING_CONTROLLER:
        owner = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Endpoints"), None)
        source = (owner.get("name", ""), owner.get("uid", "")) if owner else None
    addresses = tuple(a for e in body.get("endpoints") or [] for a in e.get("addresses") or [])
    return SliceView(name=meta.get("name", ""), uid=meta.get("uid", ""),
                     service=labels.get(naming.SERVICE_NAME_LABEL, ""), addresses=addresses,
                     mirrored_from=source)
