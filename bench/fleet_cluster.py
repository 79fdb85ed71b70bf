"""The cluster side of bench/fleet.py: the jobs it creates, the bare client it compares with, watches that
time every event, and the API server's own request counters."""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from elasticjob import builders, domain
from elasticjob.models import ElasticJobSpec
from harness import GROUP, PLURAL, VERSION, Api, wait
from localcluster import kwok_addon, storestandin
from localcluster.health import admin_context
from localcluster.layout import Layout, load_endpoints

ROOT = Path(__file__).resolve().parents[1]
THREADS = 32  # the operator's API thread pool (controller/kopf_app.py API_THREADS)
WORKERS = 4
# (verb, group, resource, subresource) that only the operator (or in its run the bare client) makes here.
CONTROLLER_ROWS = {("POST", "", "pods", ""), ("POST", "", "services", ""), ("POST", "", "secrets", ""),
                   ("POST", "networking.k8s.io", "networkpolicies", ""), ("POST", "", "events", ""),
                   ("PATCH", GROUP, PLURAL, "status"), ("PATCH", GROUP, PLURAL, ""), ("GET", GROUP, PLURAL, ""),
                   ("DELETE", "", "pods", ""), ("DELETE", "", "services", ""),
                   ("POST", "discovery.k8s.io", "endpointslices", ""),
                   ("APPLY", "discovery.k8s.io", "endpointslices", ""),
                   ("PATCH", "discovery.k8s.io", "endpointslices", "")}
BENCH_ROWS = {("POST", GROUP, PLURAL, "")}  # the bench creates the jobs in both runs



def job_manifest(name: str, kwok: bool) -> dict:
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "worker", "image": "bench", "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}
    if kwok:
        pod_spec.update(kwok_addon.POD_PLACEMENT)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {"minReplicas": 1, "maxReplicas": WORKERS, "replicas": WORKERS, "maxRestarts": 10000,
                     "rendezvous": {"image": storestandin.IMAGE}, "template": {"spec": pod_spec}}}


def apiserver_get(path: str, timeout: float = 30) -> bytes:
    """GET `path` of the local cluster's API server with the admin credentials: its /metrics, its profiles."""
    endpoints = load_endpoints(Layout(ROOT))
    with urllib.request.urlopen(f"{endpoints.server}{path}", context=admin_context(endpoints.layout),
                                timeout=timeout) as response:
        return response.read()


def request_counts(metric: str = "apiserver_request_total", text: str | None = None) -> Counter:
    """A metric of the API server's requests (by default their number) summed per (verb, group, resource,
    subresource), from `text` (its /metrics, read now if not given)."""
    if text is None:
        text = apiserver_get("/metrics").decode()
    counts: Counter = Counter()
    for labels, value in re.findall(rf"^{re.escape(metric)}\{{([^}}]*)\}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counts[(found.get("verb", ""), found.get("group", ""), found.get("resource", ""),
                found.get("subresource", ""))] += float(value)
    return counts


@dataclass
class Watch:
    """List, then watch one kind in one namespace (raw JSON, as the operator's reflector does): the newest
    body of each object by name, and every event with the monotonic time the bench received it."""

    list_fn: Callable[..., Any]
    selector: str | None = None
    objects: dict[str, dict] = field(default_factory=dict)
    events: list[tuple[float, str, dict]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)
    listed: threading.Event = field(default_factory=threading.Event)  # set once the first list is in

    def start(self) -> Watch:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        version = None
        while not self.stopped.is_set():
            try:
                if version is None:
                    page = json.loads(self.list_fn(label_selector=self.selector, _preload_content=False).data)
                    self._replace(page.get("items") or [])
                    version = page["metadata"]["resourceVersion"]
                    self.listed.set()
                response = self.list_fn(label_selector=self.selector, watch=True, resource_version=version,
                                        allow_watch_bookmarks=True, timeout_seconds=60, _preload_content=False)
                for line in response:
                    if self.stopped.is_set():
                        return
                    event = json.loads(line)
                    body = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        version = None if body.get("code") == 410 else version
                        break
                    version = body["metadata"].get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._seen(time.monotonic(), event["type"], body)
            except Exception:  # a broken stream: resume
                time.sleep(0.5)

    def _replace(self, items: list[dict]) -> None:
        with self.lock:
            self.objects = {o["metadata"]["name"]: o for o in items}

    def _seen(self, at: float, kind: str, body: dict) -> None:
        name = body["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = body
            self.events.append((at, kind, body))

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.objects.values())

    def since(self, at: float) -> list[tuple[float, str, dict]]:
        with self.lock:
            return [e for e in self.events if e[0] >= at]

    def stop(self) -> None:
        self.stopped.set()


def running(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


@contextmanager
def namespace(api: Api, prefix: str, keep: bool = False) -> Iterator[str]:
    """A fresh namespace; deleted afterwards, waiting until it is gone so that the next measurement starts
    from a quiet cluster, unless `keep` (the cluster goes with it: at 10,000 jobs the namespace controller takes
    longer than the run to delete one)."""
    name = f"{prefix}-{random.randrange(16**6):06x}"
    api.core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        if not keep:
            api.core.delete_namespace(name, propagation_policy="Background")
            wait(lambda: not _exists(api, name), 900, f"namespace {name} deleted", interval=1)


def _exists(api: Api, name: str) -> bool:
    try:
        api.core.read_namespace(name)
        return True
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def create_jobs(api: Api, ns: str, count: int, kwok: bool, then: Callable[[dict], None] | None = None,
                manifest: Callable[[str], dict] | None = None) -> float:
    """Creates `count` jobs from 32 threads (each `manifest(name)`, by default the sleeping job_manifest); `then`
    gets each created job (the bare client's work). Returns the monotonic time the first create was sent."""
    make = manifest or (lambda name: job_manifest(name, kwok))

    def one(i: int) -> None:
        # Every reply read: an unread one keeps its connection out of the pool, and the next request opens a
        # new one (a TLS handshake each).
        created = api.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, make(f"j{i:04d}"),
                                                             _preload_content=False).data
        if then is not None:
            then(json.loads(created))

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(count)))
    return started


class BareClient:
    """What any controller must do per job, with the operator's manifests and no more: the Service (its
    create returns the ClusterIP), the store pod and the workers, one status write."""

    def __init__(self, api: Api):
        self.api = api
        self.pool = ThreadPoolExecutor(THREADS)

    def submit(self, job: dict) -> None:
        self.pool.submit(self._job, job)

    def _job(self, job: dict) -> None:
        meta, core = job["metadata"], self.api.core
        ref = domain.JobRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"],
                              spec=ElasticJobSpec.model_validate(job["spec"]))
        ns = ref.namespace
        service = json.loads(core.create_namespaced_service(ns, builders.rendezvous_service(ref),
                                                            _preload_content=False).data)
        endpoint = f"{service['spec']['clusterIP']}:{ref.spec.rendezvous.port}"
        workers = [builders.worker_pod(ref, i, endpoint) for i in range(WORKERS)]
        pods = [builders.rendezvous_pod(ref, token="token"), *workers]
        for pod in pods:
            _ = core.create_namespaced_pod(ns, pod, _preload_content=False).data  # read: see create_jobs
        _ = self.api.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, ref.name, {"status": {"phase": "Pending", "replicas": WORKERS}},
            _preload_content=False).data

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def finish_all(api: Api, ns: str, pods: Watch) -> None:
    """Training ends: each worker's container exits 0, as a kubelet reports it (kwok's pods never end)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def one(pod: dict) -> None:
        status = {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}],
                  "containerStatuses": [{"name": "worker", "image": "bench", "imageID": "", "ready": False,
                                         "restartCount": 0, "started": False, "state": {"terminated": {
                                             "exitCode": 0, "reason": "Completed", "startedAt": now,
                                             "finishedAt": now}}}]}
        _ = api.core.patch_namespaced_pod_status(pod["metadata"]["name"], ns, {"status": status},
                                                 _preload_content=False).data

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, [p for p in pods.snapshot() if running(p)]))
