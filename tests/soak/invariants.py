"""What must hold at every moment of the soak, checked from outside the operator against the API server.

Jobs are followed through a watch (every version, in order), pods and Services by listing. A violation is
recorded once per object and invariant, with what was seen, so the table counts distinct breaks.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from localcluster import faults

GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
JOB_LABEL = "elasticjob.dev/job-name"
INDEX_LABEL = "elasticjob.dev/replica-index"
GC_DELAY = 90.0  # an owned object may outlive its job this long (the garbage collector, a grace period)
# A force delete removes the pod from the API at once; its kubelet stops the containers when it hears of it (at
# least 2 s for its kill). Kubernetes promises nothing about that window (as for a StatefulSet's pods): the
# replacement may run beside the old processes that long. Longer is a violation.
FORCE_DELETE_OVERLAP = 10.0
# A kubelet learns of a force delete only through the API server. Across its restart a kubelet's watch stayed broken
# (the node authorizer refusing it) and a force-deleted pod's containers ran on for 65 s beside its replacement (seen
# in CI, seed 549492): for a pod force-deleted, the overlap is tolerated this long after the API server restarted.
API_RESTART_OVERLAP = 90.0

INVARIANTS = {
    "two-live-pods": "never two live pods for one (job, replica index)",
    "counter-went-down": "status.restarts and infrastructureFailures never go down",
    "counted-twice": "no failed pod is counted twice",
    "orphan": "no pod or Service outlives its owner job beyond the garbage collector's delay",
    "succeeded-while-running": "no job is Succeeded while a worker runs",
    "not-steady": "once the churn stops, every job reaches its steady state within the bound",
    "operator-unhealthy": "the operator neither crashes nor loops on errors",
    "two-leaders": "never two operator replicas acting at once (leader terms in their logs)",
}


@dataclass
class Violations:
    seen: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    _keys: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, invariant: str, key: str, detail: str) -> None:
        with self._lock:
            if (invariant, key) not in self._keys:
                self._keys.add((invariant, key))
                self.seen[invariant].append(detail)

    def count(self, invariant: str) -> int:
        return len(self.seen.get(invariant, []))


class JobHistory:
    """Every version of every job, in order, from a watch: counters must not go down, a failure once only."""

    def __init__(self, api: client.ApiClient, namespace: str, violations: Violations):
        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.violations = namespace, violations
        self.latest: dict[str, dict] = {}  # uid -> body
        self._counters: dict[str, tuple[int, int]] = {}
        self._failures: dict[str, list[str]] = {}  # uid -> the lastFailures uids of the previous version
        self._recorded: dict[str, set[str]] = defaultdict(set)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        """List (replacing what was known: a job deleted during a gap must not linger), then watch from there."""
        while not self._stop.is_set():
            try:
                listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
                self.replace(listed["items"])
                stream = watch.Watch().stream(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                                              self.namespace, PLURAL, timeout_seconds=60,
                                              resource_version=listed["metadata"]["resourceVersion"])
                for event in stream:
                    self.observe(event["type"], event["object"])
                    if self._stop.is_set():
                        return
            except Exception:  # an API server restart: list again (versions in the gap are not seen)
                time.sleep(1)

    def replace(self, bodies: list[dict]) -> None:
        current = {b["metadata"]["uid"] for b in bodies}
        for uid in set(self.latest) - current:
            del self.latest[uid]
        for body in bodies:
            self.observe("ADDED", body)

    def observe(self, kind: str, body: dict) -> None:
        uid = body["metadata"]["uid"]
        if kind == "DELETED":
            self.latest.pop(uid, None)
            return
        self.latest[uid] = body
        status = body.get("status") or {}
        name = f"{body['metadata']['name']}({uid[:8]})"
        counters = (status.get("restarts") or 0, status.get("infrastructureFailures") or 0)
        before = self._counters.get(uid, (0, 0))
        if counters[0] < before[0] or counters[1] < before[1]:
            self.violations.add("counter-went-down", f"{uid}/{body['metadata']['resourceVersion']}",
                                f"{name}: restarts, infrastructureFailures {before} -> {counters}")
        self._counters[uid] = (max(before[0], counters[0]), max(before[1], counters[1]))
        self._check_failures(uid, name, [f.get("uid") for f in status.get("lastFailures") or []])

    def _check_failures(self, uid: str, name: str, current: list[str]) -> None:
        previous = self._failures.get(uid, [])
        if len(set(current)) != len(current):
            self.violations.add("counted-twice", f"{uid}/dup", f"{name}: lastFailures lists a pod twice: {current}")
        for failure in current:
            if failure in self._recorded[uid] and failure not in previous:
                self.violations.add("counted-twice", f"{uid}/{failure}",
                                    f"{name}: failure {failure} was recorded, dropped, and recorded again")
            self._recorded[uid].add(failure)
        self._failures[uid] = current


class Objects:
    """Pods and Services as listed now, and the processes the local nodes run."""

    def __init__(self, api: client.ApiClient, namespace: str, state_dir: Path, violations: Violations):
        self.core = client.CoreV1Api(api)
        self.namespace, self.state_dir, self.violations = namespace, state_dir, violations
        self._orphan_since: dict[str, float] = {}
        self._names: dict[str, str] = {}  # pod uid -> name, for every pod of the namespace ever listed
        self._nodes = faults.nodes(state_dir)
        self.force_deleted: dict[str, float] = {}  # Chaos's: pod name -> when it was force-deleted
        self.tolerated: set[str] = set()  # overlaps right after a force delete, as Kubernetes allows
        self.api_restarted_at = float("-inf")  # when the soak last restarted the API server (time.monotonic())

    def check(self, jobs: dict[str, dict]) -> None:
        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=JOB_LABEL).items
            services = self.core.list_namespaced_service(self.namespace, label_selector=JOB_LABEL).items
        except (ApiException, OSError):
            return  # the API server is restarting
        self._names.update({p.metadata.uid: p.metadata.name for p in pods})
        self._two_live(pods)
        self._live_processes()
        self._orphans(pods + services, jobs)
        self._succeeded_while_running(pods, jobs)

    def _two_live(self, pods: list) -> None:
        groups = defaultdict(list)
        for pod in pods:
            labels, owner = pod.metadata.labels or {}, _owner(pod)
            live = pod.status.phase in ("Pending", "Running") and not pod.metadata.deletion_timestamp
            if live and INDEX_LABEL in labels:
                groups[(owner, labels[INDEX_LABEL])].append(pod.metadata.name)
        for (owner, index), names in groups.items():
            if len(names) > 1:
                self.violations.add("two-live-pods", f"{owner}/{index}", f"job {owner[:8]} index {index}: {names}")

    def _live_processes(self) -> None:
        """Processes really running on the nodes, grouped by pod name: two pod uids at once is two workers."""
        alive = self._alive()
        for name, uids in alive.items():
            if len(uids) <= 1:
                continue
            now = time.monotonic()
            if now - self.force_deleted.get(name, float("-inf")) <= FORCE_DELETE_OVERLAP or (
                    name in self.force_deleted and now - self.api_restarted_at <= API_RESTART_OVERLAP):
                self.tolerated.add(f"{name}/{sorted(uids)}")
                continue
            self.violations.add("two-live-pods", f"proc/{name}/{sorted(uids)}",
                                f"pod {name}: processes of {len(uids)} pod uids run at once")

    def _alive(self) -> dict[str, set[str]]:
        """The uids whose processes really run on the nodes, by the name the API said for each (a pod the API no
        longer lists keeps the name it was seen under)."""
        alive = defaultdict(set)
        for uid in self._nodes.live_pod_uids():
            if uid in self._names:
                alive[self._names[uid]].add(uid)
        return alive

    def _orphans(self, objects: list, jobs: dict[str, dict]) -> None:
        now = time.monotonic()
        present = set()
        for obj in objects:
            owner = _owner(obj)
            if owner is None or owner in jobs:
                continue
            key = f"{obj.kind or type(obj).__name__}/{obj.metadata.name}/{obj.metadata.uid}"
            present.add(key)
            since = self._orphan_since.setdefault(key, now)
            if now - since > GC_DELAY:
                self.violations.add("orphan", key, f"{key} outlived its job {owner[:8]} by {now - since:.0f}s")
        for key in set(self._orphan_since) - present:
            del self._orphan_since[key]

    def _succeeded_while_running(self, pods: list, jobs: dict[str, dict]) -> None:
        for uid, body in jobs.items():
            if (body.get("status") or {}).get("phase") != "Succeeded":
                continue
            running = [p.metadata.name for p in pods if _owner(p) == uid and p.status.phase == "Running"
                       and (p.metadata.labels or {}).get("elasticjob.dev/role") == "worker"
                       and not p.metadata.deletion_timestamp]
            if running:
                self.violations.add("succeeded-while-running", uid, f"job {body['metadata']['name']} Succeeded "
                                                                    f"while {running} run")


def _owner(obj) -> str | None:
    refs = obj.metadata.owner_references or []
    return next((r.uid for r in refs if r.controller), None)


def steady(body: dict, pods: list) -> bool:
    """A final phase, suspended, or every desired worker ready."""
    status, spec = body.get("status") or {}, body.get("spec") or {}
    if status.get("phase") in ("Succeeded", "Failed", "Suspended"):
        return True
    return status.get("phase") == "Running" and status.get("readyReplicas") == spec.get("replicas")

