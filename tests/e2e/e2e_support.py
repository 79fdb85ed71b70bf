"""What the end-to-end scenarios share: the job they submit, how they read what training did, how they break things.

Training reports through progress.jsonl in a hostPath checkpoint dir (/tmp/elasticjob-e2e/<namespace>/): one JSON
line per completed step and rank, written by examples/train_ddp.py. On the local cluster every pod shares this
machine's filesystem, so the file is read directly; on any other cluster (a single-node kind) it is read through a
helper pod that mounts the same hostPath.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from elasticjob.builders import STORE_RESOURCES
from helpers import wait_for
from localcluster import registry

GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
HOST_ROOT = Path(os.environ.get("E2E_HOST_DIR", "/tmp/elasticjob-e2e"))
CHECKPOINT_MOUNT = "/ckpt"
# The worker image (images/worker-cpu.Dockerfile, loaded into kind by tests/e2e/kind/up.sh, pushed to the local
# registry by `localcluster up`) holds torch and the script at /workspace/examples; process-backed nodes ignore
# images but mount the repo at /workspace, so the same job runs unchanged on each.
_LOCAL_WORKER = f"{registry.REPOSITORY}/elasticjob-worker:{registry.VERSION}-cpu"
WORKER_IMAGE = os.environ.get("E2E_WORKER_IMAGE") or (
    f"elasticjob-worker:{registry.VERSION}-cpu" if os.environ.get("E2E_CLUSTER") == "kind" else _LOCAL_WORKER)
# What pods a test makes itself (not the operator) pull the worker image with on real local nodes (the namespace
# fixture makes the secret there); elsewhere the name matches no Secret and the kubelet pulls without it.
PULL_SECRETS = [{"name": registry.PULL_SECRET}]
TRAIN_SCRIPT = os.environ.get("E2E_TRAIN_SCRIPT", "/workspace/examples/train_ddp.py")
JOB_NAME = "train"


# ---------------------------------------------------------------- the job


def job_manifest(namespace: str, *, train_args: list[str], min_replicas: int = 1, max_replicas: int = 3,
                 replicas: int = 2, max_restarts: int = 3, name: str = JOB_NAME, warm_starts: bool = True,
                 **spec_extra: Any) -> dict:
    """An ElasticJob running `torchrun train_ddp.py` with a shared hostPath checkpoint dir and fast rendezvous
    timeouts; `warm_starts` is spec.warmStarts (the operator's default: workers forked from a process that
    imported torch once, where the operator has a kit)."""
    spec = {
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "replicas": replicas,
        "nprocPerNode": 1,
        "maxRestarts": max_restarts,
        "warmStarts": warm_starts,
        "checkpointDir": CHECKPOINT_MOUNT,
        # Keep finished pods: the scenarios assert on their exit codes.
        "runPolicy": {"cleanPodPolicy": "None"},
        # Heartbeats at the defaults (1 s, 5 attempts): the scenarios prove what users get.
        "rendezvous": {"lastCallTimeoutSeconds": 1},
        "template": {"spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "worker",
                "image": WORKER_IMAGE,
                "command": ["torchrun", TRAIN_SCRIPT, *train_args],
                # The agent's rendezvous decisions in the pod log, for the post-mortem of a slow recovery.
                "env": [{"name": "LOGLEVEL", "value": "INFO"}],
                "volumeMounts": [{"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT}],
            }],
            "volumes": [{"name": "checkpoint", "hostPath": {"path": str(HOST_ROOT / namespace),
                                                            "type": "DirectoryOrCreate"}}],
        }},
    }
    for key, value in spec_extra.items():
        spec[key] = value
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def spread_workers(manifest: dict) -> dict:
    """No two of the job's workers on one node: a node lost then takes one worker, as the scenario needs. The
    default scheduler packed both on one real node (nothing spreads pods that no controller owns)."""
    job = manifest["metadata"]["name"]
    manifest["spec"]["template"]["spec"]["affinity"] = {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {f"{GROUP}/job-name": job, f"{GROUP}/role": "worker"}}}]}}
    return manifest


def train_args(steps: int, *, step_seconds: float = 0.25, checkpoint_every: int = 5, extra: tuple = ()) -> list[str]:
    return ["--steps", str(steps), "--step-seconds", str(step_seconds), "--checkpoint-every", str(checkpoint_every),
            *map(str, extra)]


@dataclass
class Jobs:
    """The ElasticJob API of one namespace, and the pods behind it."""

    api_client: Any
    namespace: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    def create(self, manifest: dict) -> dict:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest)

    def get(self, name: str = JOB_NAME) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def status(self, name: str = JOB_NAME) -> dict:
        return self.get(name).get("status") or {}

    def delete(self, name: str = JOB_NAME) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def scale(self, replicas: int, name: str = JOB_NAME) -> None:
        """Through the scale subresource, as `kubectl scale` and HPAs do."""
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"replicas": replicas}})

    def worker_pods(self, name: str = JOB_NAME) -> list[client.V1Pod]:
        """The job's worker pods: its labels and its controller reference. A stranger may wear the labels (the
        intruder test's neighbour does where the chart's jobLabelPolicy is not yet in force when it is made)."""
        selector = f"elasticjob.dev/job-name={name},elasticjob.dev/role=worker"
        return [p for p in self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
                if any(o.controller and o.kind == "ElasticJob" and o.name == name
                       for o in p.metadata.owner_references or [])]

    def live_workers(self, name: str = JOB_NAME) -> list[client.V1Pod]:
        """Worker pods that run or are about to, and are not leaving (a pod on a lost node stays Running in the
        API until it is removed; it is not training)."""
        return [p for p in self.worker_pods(name)
                if p.status.phase in ("Pending", "Running") and not p.metadata.deletion_timestamp]

    def pod(self, pod_name: str) -> client.V1Pod:
        return self.core.read_namespaced_pod(pod_name, self.namespace)

    def wait_phase(self, phase: str, timeout: float, name: str = JOB_NAME) -> dict:
        """Waits until status.phase is `phase`; fails at once if the job finished in another phase."""

        def observe() -> dict:
            status = self.status(name)
            if status.get("phase") in ("Succeeded", "Failed") and status.get("phase") != phase:
                raise AssertionError(f"job finished {status.get('phase')} while waiting for {phase}: "
                                     f"{summary(status)}; pods: {self.pods_summary(name)}")
            return status

        return wait_for(observe, timeout, f"job {self.namespace}/{name} phase {phase}",
                        until=lambda s: s.get("phase") == phase)

    def pods_summary(self, name: str = JOB_NAME) -> list[str]:
        return [pod_summary(p) for p in self.worker_pods(name)]


def story(jobs: Jobs, name: str = JOB_NAME) -> str:
    """What a failed scenario's message should carry: the job's status, its pods and its Events in order, so that
    a CI run's output is enough to see what happened."""
    status = jobs.status(name)
    events = sorted(jobs.core.list_namespaced_event(jobs.namespace).items,
                    key=lambda e: str(e.last_timestamp or e.event_time or e.first_timestamp or ""))
    lines = [f"status: {summary(status)}", f"avoidedNodes: {status.get('avoidedNodes')}",
             f"lastFailures: {[(f.get('pod'), f.get('reason'), f.get('charged')) for f in status.get('lastFailures', [])]}",
             "pods:", *(f"  {p}" for p in jobs.pods_summary(name)), "events:"]
    lines += [f"  {e.last_timestamp or e.event_time} {e.involved_object.kind}/{e.involved_object.name} {e.reason}: "
              f"{(e.message or '')[:300]}" for e in events]
    return "\n".join(lines)


def summary(status: dict) -> dict:
    keep = ("phase", "reason", "message", "replicas", "readyReplicas", "restarts", "infrastructureFailures")
    return {k: status.get(k) for k in keep if k in status}


def pod_summary(pod: client.V1Pod) -> str:
    states = []
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        term = cs.state.terminated if cs.state else None
        states.append(f"{cs.name}:exit={term.exit_code}" if term else f"{cs.name}:running={bool(cs.state.running)}")
    return f"{pod.metadata.name}[{pod.status.phase if pod.status else '?'} node={pod.spec.node_name} {' '.join(states)}]"


def exit_codes(pods: list[client.V1Pod]) -> dict[str, int | None]:
    codes = {}
    for pod in pods:
        statuses = [cs for cs in (pod.status.container_statuses or []) if cs.name == "worker"]
        term = statuses[0].state.terminated if statuses and statuses[0].state else None
        codes[pod.metadata.name] = term.exit_code if term else None
    return codes


# ---------------------------------------------------------------- what training did


class Progress:
    """The step records of one job, in the order they were written."""

    def __init__(self, records: list[dict]):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        tail = [(r["step"], r["rank"], r["world_size"], r["host"]) for r in self.records[-4:]]
        return f"Progress({len(self.records)} records, last step {self.last_step}, tail (step, rank, ws, host) {tail})"

    @property
    def last_step(self) -> int:
        return max((r["step"] for r in self.records), default=0)

    def world_sizes(self) -> set[int]:
        return {r["world_size"] for r in self.records}

    def after(self, when: float) -> list[dict]:
        return [r for r in self.records if r["time"] > when]

    def first_after(self, when: float, world_size: int | None = None) -> dict | None:
        """The first step completed by a worker process that had written nothing before `when`.

        Only such a step shows recovery: a surviving worker may still finish the step it was in when the fault hit.
        """
        old = {process(r) for r in self.records if r["time"] <= when}
        later = [r for r in self.after(when) if process(r) not in old
                 and (world_size is None or r["world_size"] == world_size)]
        return min(later, key=lambda r: r["time"], default=None)

    def rank0_host(self) -> str:
        return [r for r in self.records if r["rank"] == 0][-1]["host"]

    def steps_by_world_size(self, world_size: int) -> set[int]:
        return {r["step"] for r in self.records if r["world_size"] == world_size}


def process(record: dict) -> tuple:
    """Which worker process wrote a record: pod names and PIDs (in a PID namespace) repeat across pods."""
    return record["host"], record["pid"], record["started"]


class LocalProgressReader:
    """The local cluster's pods share this filesystem."""

    def __init__(self, namespace: str):
        self.dir = HOST_ROOT / namespace
        self.dir.mkdir(parents=True, exist_ok=True)

    def read_text(self, name: str = "progress.jsonl") -> str:
        try:
            return (self.dir / name).read_text()
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class PodProgressReader:
    """Reads the hostPath through a helper pod: on a single-node kind cluster it sees the workers' directory."""

    POD = "progress-reader"

    def __init__(self, jobs: Jobs):
        self.jobs = jobs
        path = str(HOST_ROOT / jobs.namespace)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": self.POD}, "spec": {
            "imagePullSecrets": PULL_SECRETS,
            "containers": [{"name": "reader", "image": WORKER_IMAGE,
                            "command": ["python", "-c", "import time; time.sleep(10**9)"],
                            "volumeMounts": [{"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT}]}],
            "volumes": [{"name": "checkpoint", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}],
            "terminationGracePeriodSeconds": 0}}
        jobs.core.create_namespaced_pod(jobs.namespace, pod)
        wait_for(lambda: jobs.pod(self.POD).status.phase, 120, "the progress-reader pod to run",
                 until=lambda phase: phase == "Running")

    def read_text(self, name: str = "progress.jsonl") -> str:
        from kubernetes.stream import stream

        return stream(self.jobs.core.connect_get_namespaced_pod_exec, self.POD, self.jobs.namespace,
                      command=["sh", "-c", f"cat {CHECKPOINT_MOUNT}/{name} 2>/dev/null || true"],
                      stderr=False, stdin=False, stdout=True, tty=False)

    def close(self) -> None:
        try:
            self.jobs.core.delete_namespaced_pod(self.POD, self.jobs.namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise


def parse_events(text: str) -> list[dict]:
    """The script's events.jsonl: checkpoints saved on SIGTERM."""
    return parse_progress(text).records


def parse_progress(text: str) -> Progress:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written right now
    return Progress(records)


STORE_CPU = parse_quantity(STORE_RESOURCES["requests"]["cpu"])


def free_cpu(core: client.CoreV1Api) -> Decimal:
    """Cores (a Decimal) of the schedulable nodes' allocatable CPU that no unfinished pod requests."""
    nodes = [n for n in core.list_node().items if not n.spec.unschedulable]
    total = sum((parse_quantity(n.status.allocatable["cpu"]) for n in nodes), parse_quantity("0"))
    names = {n.metadata.name for n in nodes}
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name in names and pod.status.phase not in ("Succeeded", "Failed"):
            for c in pod.spec.containers:
                total -= parse_quantity(((c.resources and c.resources.requests) or {}).get("cpu", "0"))
    return total


# ---------------------------------------------------------------- faults


@dataclass
class Faults:
    """Breaks pods and nodes: through the local cluster's faults API, or through the API server elsewhere."""

    cluster: Any  # tests/conftest.py ClusterHandle
    jobs: Jobs
    state_dir: Path

    @property
    def local(self) -> bool:
        return self.cluster.kind == "local"

    def kill_pod(self, pod_name: str) -> float:
        """SIGKILL every process of the pod (as a crashed node or OOM would). Returns the time of the fault."""
        when = time.time()
        if self.local:
            from localcluster import faults

            hits = faults.kill_pod(self.jobs.namespace, pod_name, signal.SIGKILL, self.state_dir)
            assert hits, f"pod {pod_name} has no running container to kill"
        elif self.cluster.kind == "kind":
            self._kind_kill(pod_name)
        else:  # another cluster: the nearest the API offers (a deleted pod is replaced, not charged)
            self.jobs.core.delete_namespaced_pod(pod_name, self.jobs.namespace, grace_period_seconds=0)
        return when

    def _kind_kill(self, pod_name: str) -> None:
        """On kind each node is a Docker container holding a containerd: SIGKILL every process of each of the
        pod's running containers there (`ctr tasks kill --all`), as the local cluster's faults API does."""
        from localcluster.realnodes.faults import running_containers

        pod = self.jobs.pod(pod_name)
        ids = running_containers(pod)
        assert ids, f"pod {pod_name} has no running container to kill"
        docker = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
        for container in ids:
            subprocess.run([docker, "exec", pod.spec.node_name, "ctr", "-n", "k8s.io", "tasks", "kill", "--all",
                            "-s", "SIGKILL", container], check=True, capture_output=True, timeout=30)

    def lose_node(self, node: str) -> float:
        from localcluster import faults

        when = time.time()
        faults.node_loss(node, self.state_dir)
        return when

    def restore_node(self, node: str) -> None:
        from localcluster import faults

        faults.restore_node(node, self.state_dir)

    def partition(self, pod_name: str) -> float:
        """Cut the pod off the network; its processes live on, silent (no TCP reset)."""
        from localcluster import partition

        when = time.time()
        assert partition.partition(self.jobs.namespace, pod_name, self.state_dir), f"pod {pod_name} not running"
        return when

    def heal(self, pod_name: str) -> None:
        from localcluster import partition

        partition.heal(self.jobs.namespace, pod_name, self.state_dir)

    def throttle(self, pod_name: str, percent: int | None) -> float:
        """Caps the pod's containers at `percent` of one CPU (None lifts it): a slow node. Real nodes only."""
        return self._on_its_node(pod_name, lambda nodes: nodes.throttle(self.jobs.namespace, pod_name, percent))

    def slow_link(self, pod_name: str, rate_mbit: int | None) -> float:
        """What the pod sends goes at `rate_mbit` at most (None lifts it): a sick NIC. Real nodes only."""
        return self._on_its_node(pod_name, lambda nodes: nodes.slow_link(self.jobs.namespace, pod_name, rate_mbit))

    def _on_its_node(self, pod_name: str, act) -> float:
        """Does `act(nodes)` through the local cluster's kind of node; when, and it must have hit the pod."""
        from localcluster import faults

        nodes = faults.nodes(self.state_dir)
        when = time.time()
        assert act(nodes), f"pod {pod_name}: nothing to act on (not running yet?)"
        return when

    def sicken(self, node: str) -> float:
        """Every training process of the job on `node` exits 1, now and later (examples/train_ddp.py's
        --fail-on-marked-node SICK_NODES_MOUNT): a GPU that throws an error at every start. The marker is a file
        of the job's checkpoint hostPath, which every pod of the local cluster mounts from this machine."""
        marker = HOST_ROOT / self.jobs.namespace / SICK_NODES_DIR / node
        marker.parent.mkdir(parents=True, exist_ok=True)
        when = time.time()
        marker.write_text(f"{when}\n")
        return when


SICK_NODES_DIR = "sick-nodes"
SICK_NODES_MOUNT = f"{CHECKPOINT_MOUNT}/{SICK_NODES_DIR}"


def with_node_name(manifest: dict) -> dict:
    """The worker learns its node through the downward API (NODE_NAME), as a sick node's marker names it."""
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [*container.get("env", []),
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    return manifest


class Placements:
    """Every worker pod of the namespace and the node it was bound to, from a watch of the API server (a pod
    deleted before the test looks again is still seen): (uid, node, creation time as epoch seconds)."""

    def __init__(self, core: client.CoreV1Api, namespace: str):
        import threading

        from kubernetes import watch

        self.seen: dict[str, tuple[str, float]] = {}
        self._stopped = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(core, namespace), daemon=True)
        self._thread.start()

    def _run(self, core: client.CoreV1Api, namespace: str) -> None:
        """Watches again whenever a watch ends (the API server closes them), until stop(): a list at each start
        sees what happened meanwhile, and a pod bound and deleted between two watches is the one gap."""
        import urllib3

        selector = f"{GROUP}/role=worker"
        while not self._stopped:
            try:
                for event in self._watch.stream(core.list_namespaced_pod, namespace, label_selector=selector,
                                                timeout_seconds=120):
                    pod = event["object"]
                    if pod.spec.node_name:
                        self.seen[pod.metadata.uid] = (pod.spec.node_name,
                                                       pod.metadata.creation_timestamp.timestamp())
            except (ApiException, urllib3.exceptions.HTTPError, OSError):
                continue

    def created_on(self, node: str, after: float) -> list[str]:
        return sorted(uid for uid, (where, created) in dict(self.seen).items() if where == node and created > after)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()
