"""Kueue's objects for a job: its Workload, views of it and of ResourceFlavors, and the status a job
integration writes to it. Pure.

What the operator writes follows Kueue v0.19's own job integrations (pkg/controller/jobframework/reconciler.go,
pkg/workload): the Workload is named and labelled as Kueue names its own, and its status is written by
server-side apply as field manager `kueue-admission`, forced, at the resourceVersion it was planned from, with
every admission-managed condition in the patch, so that what the patch leaves out (status.admission, when the
quota is released) is removed.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from elasticjob import kit, naming
from elasticjob.builders import owner_reference, rendezvous_pod, worker_container
from elasticjob.domain import JobRef, Placement
from elasticjob.kueue import names as kueue_names
from elasticjob.models import ElasticJobSpec

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS, FLAVORS = "workloads", "resourceflavors"
FIELD_MANAGER = "kueue-admission"  # sigs.k8s.io/kueue/pkg/constants.AdmissionName
# Conditions Kueue's admission owns (pkg/workload/patching: admissionManagedConditions); each patch carries them.
ADMISSION_CONDITIONS = ("QuotaReserved", "BlockedOnPreemptionGates", "Evicted", "Admitted", "Preempted",
                        "Requeued", "DeactivationTarget", "Finished", "PodsReady")
# Evictions after which Kueue requeues the workload at once (jobframework: Requeued=True).
REQUEUED_AFTER = ("Preempted", "NodeFailures")
# Status fields an admission patch copies as they are (pkg/workload/patching: admissionStatusPatch).
COPIED_STATUS = ("accumulatedPastExecutionTimeSeconds", "clusterName", "nominatedClusterNames", "unhealthyNodes",
                 "preemptionGates")
# Workload slices (Kueue's ElasticJobsViaWorkloadSlices, pkg/workloadslicing): a slice that replaces an admitted
# one is charged only the difference, and once admitted Kueue marks the one it replaces Finished.
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
REPLACES_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
SLICE_NAME_ANNOTATION = "kueue.x-k8s.io/workload-slice-name"
SLICE_REPLACED = "WorkloadSliceReplaced"
# The hash of the spec.template a Workload was made from, on its workers' pod set template: Kueue charges that
# template, so a job whose template changed since runs no pod of the new one on this Workload (admission.py).
TEMPLATE_HASH_ANNOTATION = "elasticjob.dev/template-hash"


@dataclass(frozen=True)
class Priority:
    """What the job's priority class says: Kueue's spec.priorityClassRef and spec.priority; or why not."""

    ref: tuple[tuple[str, str], ...] = ()  # group, kind, name
    value: int | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Assignment:
    name: str
    count: int | None
    flavors: tuple[tuple[str, str], ...] = ()  # resource -> flavor


@dataclass(frozen=True)
class WorkloadView:
    name: str
    uid: str
    owner_uid: str | None
    resource_version: str
    generation: int
    namespace: str = ""
    queue_name: str | None = None
    pod_sets: tuple[tuple[str, int, int | None], ...] = ()  # name, count, minCount
    cluster_queue: str | None = None
    assignments: tuple[Assignment, ...] = ()
    deleting: bool = False
    status: Mapping[str, Any] = field(default_factory=dict)  # as the API server sent it (for patches)
    replaces: str | None = None  # a slice: "namespace/name" of the Workload it replaces
    created: str = ""  # creationTimestamp, then the uid: Kueue's order of a job's slices
    spec_pod_sets: tuple[Mapping[str, Any], ...] = ()  # as the API server sent them (for a count's patch)
    template_hash: str | None = None  # of the spec.template it was made from; None: made before hashes were kept

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == kind), None)

    def true(self, kind: str) -> bool:
        return (self.condition(kind) or {}).get("status") == "True"

    @property
    def quota_reserved(self) -> bool:
        return self.true("QuotaReserved")

    @property
    def admitted(self) -> bool:
        """Admitted and not being evicted: pods may run."""
        return self.true("Admitted") and not self.true("Evicted") and self.cluster_queue is not None

    @property
    def evicted(self) -> Mapping[str, Any] | None:
        return self.condition("Evicted") if self.true("Evicted") else None

    @property
    def finished(self) -> bool:
        return self.true("Finished")

    def assignment(self, pod_set: str) -> Assignment | None:
        return next((a for a in self.assignments if a.name == pod_set), None)

    def pod_set(self, name: str) -> tuple[int, int | None] | None:
        return next(((count, minimum) for n, count, minimum in self.pod_sets if n == name), None)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class FlavorView:
    name: str
    node_labels: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()


# --- what the operator reads ------------------------------------------------------------------------------


def workload_view(body: Mapping[str, Any]) -> WorkloadView:
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    admission = status.get("admission") or {}
    assignments = tuple(
        Assignment(a.get("name", ""), a.get("count"), tuple(sorted((a.get("flavors") or {}).items())))
        for a in admission.get("podSetAssignments") or [])
    owner = next((r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    return WorkloadView(
        name=meta.get("name", ""), uid=meta.get("uid", ""), owner_uid=owner,
        resource_version=meta.get("resourceVersion", ""), generation=meta.get("generation", 0),
        namespace=meta.get("namespace", ""), queue_name=spec.get("queueName"),
        pod_sets=tuple((p.get("name", ""), p.get("count", 0), p.get("minCount")) for p in spec.get("podSets") or []),
        cluster_queue=admission.get("clusterQueue"), assignments=assignments,
        deleting=meta.get("deletionTimestamp") is not None, status=copy.deepcopy(dict(status)),
        replaces=(meta.get("annotations") or {}).get(REPLACES_ANNOTATION),
        created=f"{meta.get('creationTimestamp', '')}/{meta.get('uid', '')}",
        spec_pod_sets=tuple(copy.deepcopy(p) for p in spec.get("podSets") or []),
        template_hash=charged_template_hash(spec.get("podSets") or []))


def charged_template_hash(sets: list[Mapping[str, Any]]) -> str | None:
    workers = next((p for p in sets if p.get("name") == kueue_names.PODSET_WORKERS), {})
    annotations = ((workers.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    found = annotations.get(TEMPLATE_HASH_ANNOTATION)
    return found if isinstance(found, str) else None


def flavor_view(body: Mapping[str, Any]) -> FlavorView:
    spec = body.get("spec") or {}
    return FlavorView(name=(body.get("metadata") or {}).get("name", ""),
                      node_labels=tuple(sorted((spec.get("nodeLabels") or {}).items())),
                      tolerations=tuple(spec.get("tolerations") or []))


def queue_name(labels: Mapping[str, str]) -> str | None:
    return labels.get(kueue_names.QUEUE_LABEL) or None


# --- what the operator makes ------------------------------------------------------------------------------


def template_hash(spec: ElasticJobSpec) -> str:
    """What identifies the worker template Kueue is asked to charge: the job's spec.template as written (not the
    kit's init container, which an operator upgrade changes: that is no change of the user's), less the defaults
    the CRD's schema fills in (a port's TCP): a job stored before the schema had them reads back with them."""
    text = json.dumps(without_schema_defaults(spec.template), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def without_schema_defaults(template: Mapping[str, Any]) -> dict[str, Any]:
    """The template with each container port's `protocol: TCP` dropped: the API server defaults it on every read
    since the CRD carries the pod template's schema, so `TCP` and nothing are the same template."""
    copied: dict[str, Any] = json.loads(json.dumps(template))
    pod = copied.get("spec") or {}
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(kind) or []:
            for port in container.get("ports") or []:
                if port.get("protocol") == "TCP":
                    del port["protocol"]
    return copied


def pod_sets(job: JobRef, kit_image: str | None = None) -> list[dict[str, Any]]:
    """`workers`: count = replicas, minCount = minReplicas (Kueue's partial admission may give fewer, never
    fewer than that); `store`: the rendezvous pod. The templates carry the requests Kueue counts quota by,
    the kit's init container included where the pods get it (a pod requests the most of any init container and
    the sum of its containers)."""
    spec = job.spec
    template = copy.deepcopy(spec.template)
    template.setdefault("metadata", {})
    template["metadata"]["annotations"] = {**(template["metadata"].get("annotations") or {}),
                                           TEMPLATE_HASH_ANNOTATION: template_hash(spec)}
    copied = kit.copied_from(spec, kit_image)  # none where the job's image carries the kit (spec.kit: Image)
    if copied and kit.warm_starts(spec, worker_container(template) or {}, kit_image).on:
        kit.add_to_pod(template["spec"], copied)
    # The warm spares are in the workers' podset: pods like them, admitted under the same quota.
    workers: dict[str, Any] = {"name": kueue_names.PODSET_WORKERS, "count": spec.desired_pods, "template": template}
    if spec.min_replicas < spec.desired_pods:
        workers["minCount"] = spec.min_replicas
    store = rendezvous_pod(job, kit_image=kit_image)
    return [workers, {"name": kueue_names.PODSET_STORE, "count": 1,
                      "template": {"metadata": {}, "spec": store["spec"]}}]


def workload(job: JobRef, queue: str, priority: Priority | None, kit_image: str | None = None,
             name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets(job, kit_image)}
    if priority is not None and priority.ref:
        spec["priorityClassRef"] = dict(priority.ref)
        spec["priority"] = priority.value
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": name or kueue_names.workload_name(job.name, job.uid), "namespace": job.namespace,
                     "labels": {**naming.job_labels(job.name), kueue_names.KUEUE_JOB_UID_LABEL: job.uid},
                     "ownerReferences": [owner_reference(job)]},
        "spec": spec,
    }


def workload_slice(job: JobRef, queue: str, priority: Priority | None, kit_image: str | None, workers: int,
                   replaced: WorkloadView, name: str) -> dict[str, Any]:
    """A slice that replaces the admitted `replaced` with `workers` workers (jobframework prepareWorkloadSlice):
    Kueue charges it only what `replaced` does not hold already. No minCount: Kueue refuses partial admission
    of an elastic slice, so a slice is admitted whole or waits."""
    body = workload(job, queue, priority, kit_image)
    body["metadata"]["name"] = name
    workers_set = next(p for p in body["spec"]["podSets"] if p["name"] == kueue_names.PODSET_WORKERS)
    workers_set["count"] = workers
    workers_set.pop("minCount", None)
    body["metadata"]["annotations"] = {ELASTIC_ANNOTATION: "true", REPLACES_ANNOTATION: replaced.key,
                                       SLICE_NAME_ANNOTATION: kueue_names.workload_name(job.name, job.uid)}
    return body


def current_slice(workloads: list[WorkloadView] | tuple[WorkloadView, ...]) -> WorkloadView | None:
    """The job's Workload that counts (as pkg/workloadslicing normalizeActiveSlices): of those not finished, the
    newest holding quota that no slice holding quota replaces (an evicted one too: its pods must stop first);
    else the newest that replaces none of them (a slice waiting to replace one is not the job's admission)."""
    live = sorted((w for w in workloads if not w.finished), key=lambda w: w.created)
    replaced = {w.replaces for w in live if w.replaces and w.quota_reserved and not w.evicted}
    holding = [w for w in live if w.quota_reserved and w.key not in replaced]
    if holding:
        return holding[-1]
    keys = {w.key for w in live}
    heads = [w for w in live if w.replaces not in keys]
    return heads[-1] if heads else live[-1] if live else None


def with_workers(view: WorkloadView, workers: int) -> list[dict[str, Any]]:
    """The Workload's pod sets as stored, the workers' count changed: Kueue lets an admitted slice shrink in
    place (every other field of an admitted pod set is immutable)."""
    sets = [copy.deepcopy(dict(p)) for p in view.spec_pod_sets]
    for pod_set in sets:
        if pod_set.get("name") == kueue_names.PODSET_WORKERS:
            pod_set["count"] = workers
    return sets


def pod_sets_match(view: WorkloadView, job: JobRef, queue: str) -> bool:
    """Whether the Workload asks for what the spec says now: queue, counts and the template (by its hash)."""
    spec = job.spec
    minimum = spec.min_replicas if spec.min_replicas < spec.desired_pods else None
    return (view.queue_name == queue and view.pod_set(kueue_names.PODSET_WORKERS) == (spec.desired_pods, minimum)
            and not template_changed(view, job))


def template_changed(view: WorkloadView, job: JobRef) -> bool:
    """The job's spec.template is not the one the Workload charges. A Workload made before hashes were kept
    says nothing: taken as the same."""
    return view.template_hash is not None and view.template_hash != template_hash(job.spec)


def placement(view: WorkloadView, pod_set: str, flavors: Mapping[str, FlavorView]) -> Placement:
    """What Kueue's admission puts on a pod set's pods: each assigned flavor's nodeLabels as nodeSelector
    and its tolerations (jobframework podset.FromAssignment), and the pod-set label."""
    assignment = view.assignment(pod_set)
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for name in sorted({flavor for _, flavor in assignment.flavors}) if assignment else []:
        flavor = flavors.get(name)
        if flavor is not None:
            selector.update(dict(flavor.node_labels))
            tolerations += [copy.deepcopy(t) for t in flavor.tolerations]
    return Placement(labels=((kueue_names.PODSET_LABEL, pod_set),), node_selector=tuple(sorted(selector.items())),
                     tolerations=tuple(tolerations))


def missing_flavors(view: WorkloadView, flavors: Mapping[str, FlavorView]) -> list[str]:
    names = {flavor for a in view.assignments for _, flavor in a.flavors}
    return sorted(n for n in names if n not in flavors)


# --- the status a job integration writes -----------------------------------------------------------------


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _set(conditions: list[dict[str, Any]], kind: str, status: str, reason: str, message: str, generation: int,
         now: datetime) -> None:
    """apimeta.SetStatusCondition: the transition time moves only when the status does."""
    found = next((c for c in conditions if c.get("type") == kind), None)
    if found is None:
        conditions.append({"type": kind, "status": status, "reason": reason, "message": message[:32768],
                           "observedGeneration": generation, "lastTransitionTime": _stamp(now)})
        return
    if found.get("status") != status:
        found["status"], found["lastTransitionTime"] = status, _stamp(now)
    found.update(reason=reason, message=message[:32768], observedGeneration=generation)


def _admission_patch(view: WorkloadView, conditions: list[dict[str, Any]], admission: Any) -> dict[str, Any]:
    """pkg/workload/patching prepareWorkloadPatch: what a kueue-admission apply carries."""
    old = view.status
    status: dict[str, Any] = {"conditions": [c for c in conditions if c.get("type") in ADMISSION_CONDITIONS]}
    if admission is not None:
        status["admission"] = admission
        status["resourceRequests"] = []
    elif old.get("resourceRequests"):
        status["resourceRequests"] = copy.deepcopy(old["resourceRequests"])
    requeue = old.get("requeueState") or {}
    if requeue.get("count") is not None or requeue.get("requeueAt") is not None:
        status["requeueState"] = copy.deepcopy(requeue)
    evictions = (old.get("schedulingStats") or {}).get("evictions")
    if evictions:
        status["schedulingStats"] = {"evictions": copy.deepcopy(evictions)}
    for key in COPIED_STATUS:
        if old.get(key) is not None:
            status[key] = copy.deepcopy(old[key])
    if old.get("admissionChecks"):
        status["admissionChecks"] = copy.deepcopy(old["admissionChecks"])
    return {"apiVersion": API_VERSION, "kind": "Workload",
            "metadata": {"name": view.name, "namespace": view.namespace, "uid": view.uid,
                         "resourceVersion": view.resource_version},
            "status": status}


def release_quota(view: WorkloadView, now: datetime) -> dict[str, Any]:
    """After an eviction, once the job's pods are gone: Requeued (True after a preemption or node failures),
    QuotaReserved=False (Pending, Kueue's eviction message), status.admission cleared, Admitted=False
    (NoReservation): jobframework ReconcileGenericJob, step 6."""
    evicted = view.evicted or {}
    reason, message = evicted.get("reason", ""), evicted.get("message", "")
    conditions = copy.deepcopy(list(view.status.get("conditions") or []))
    generation = view.generation
    _set(conditions, "Requeued", "True" if reason in REQUEUED_AFTER else "False", reason, message, generation, now)
    _set(conditions, "QuotaReserved", "False", "Pending", message, generation, now)
    checks_ready = all(c.get("state") == "Ready" for c in view.status.get("admissionChecks") or [])
    _set(conditions, "Admitted", "False", "NoReservation" if checks_ready else "NoReservationUnsatisfiedChecks",
         "The workload has no reservation" if checks_ready else
         "The workload has no reservation and not all checks ready", generation, now)
    return _admission_patch(view, conditions, None)


def finish(view: WorkloadView, succeeded: bool, message: str, now: datetime,
           reason: str | None = None) -> dict[str, Any]:
    """Finished=True (Succeeded or Failed, or `reason`: a replaced slice), the admission kept:
    pkg/workload/finish.Finish. Kueue then releases the quota of a finished workload itself."""
    conditions = copy.deepcopy(list(view.status.get("conditions") or []))
    reason = reason or ("Succeeded" if succeeded else "Failed")
    _set(conditions, "Finished", "True", reason, message, view.generation, now)
    return _admission_patch(view, conditions, copy.deepcopy(view.status.get("admission")))


def same_to_plan(a: WorkloadView, b: WorkloadView) -> bool:
    """Kueue rewrites a Workload's status often (requeue state, scheduling stats): only a change to what the
    planner decides on wakes the job (the controller's mirror asks)."""
    keep = ("QuotaReserved", "Admitted", "Evicted", "Finished")
    return (a.resource_version == b.resource_version
            or (a.pod_sets, a.cluster_queue, a.assignments, a.deleting, a.queue_name) ==
            (b.pod_sets, b.cluster_queue, b.assignments, b.deleting, b.queue_name)
            and [a.condition(k) for k in keep] == [b.condition(k) for k in keep])
