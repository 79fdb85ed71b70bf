"""What the soak does to the cluster: randomized (seeded) orderings of everyday operations and faults.

Jobs reuse a few names, so deletes and re-creations collide with what the garbage collector has not yet
removed. Workers are cheap `sleep`-like processes that exit 0 once their job's gate file appears. The operator's
replicas, and their kills: operators.py.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localcluster import registry

GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
NAMES = ("alpha", "beta", "gamma", "delta")
WORKER = ("import os, sys, time\n"
          "gate = sys.argv[1]\n"
          "while not os.path.exists(gate):\n"
          "    time.sleep(0.2)\n")


def job_manifest(name: str, replicas: int, gate: Path) -> dict:
    """A light worker (Python waiting for its gate file, no torch) in the worker image, which real nodes pull from
    the local registry with its pull secret (process-backed nodes ignore images); the gate's directory is this
    host's, mounted at the same path."""
    image = f"{registry.REPOSITORY}/elasticjob-worker:{registry.VERSION}-cpu"
    container = {"name": "worker", "image": image, "command": ["python", "-c", WORKER, str(gate)],
                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                 "volumeMounts": [{"name": "gates", "mountPath": str(gate.parent)}]}
    volume = {"name": "gates", "hostPath": {"path": str(gate.parent), "type": "DirectoryOrCreate"}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {"minReplicas": 1, "maxReplicas": 3, "replicas": replicas, "maxRestarts": 1000,
                     "runPolicy": {"ttlSecondsAfterFinished": 30},
                     "template": {"spec": {"terminationGracePeriodSeconds": 2, "containers": [container],
                                           "imagePullSecrets": [{"name": registry.PULL_SECRET}],
                                           "volumes": [volume]}}}}


class Chaos:
    def __init__(self, api: client.ApiClient, namespace: str, rng: random.Random, state_dir: Path, gates: Path):
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.namespace, self.rng, self.state_dir, self.gates = namespace, rng, state_dir, gates
        self.counts: Counter[str] = Counter()
        # pod name -> when it was force-deleted: the API forgets it before its node has stopped it.
        self.force_deleted: dict[str, float] = {}
        self._undo: list[tuple[float, str, str]] = []  # (when, what, node)
        self.ops = [(4, self.create), (2, self.delete), (3, self.recreate), (4, self.scale), (4, self.crash_worker),
                    (1, self.finish), (2, self.force_delete), (2, self.evict), (1, self.drain), (1, self.suspend)]

    def step(self) -> None:
        self._run_undos()
        op = self.rng.choices([o for _, o in self.ops], weights=[w for w, _ in self.ops])[0]
        try:
            if op() is not False:
                self.counts[op.__name__] += 1
        except (ApiException, OSError):
            self.counts["refused by the API server"] += 1  # e.g. during a control-plane restart

    def settle(self) -> None:
        """Undo what waits to be undone (cordons), now."""
        self._run_undos(force=True)

    # --- jobs ---------------------------------------------------------------------------------------------

    def _jobs(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]

    def _pick_job(self) -> dict | None:
        jobs = self._jobs()
        return self.rng.choice(jobs) if jobs else None

    def create(self, name: str | None = None) -> bool:
        name = name or self.rng.choice(NAMES)
        gate = self.gates / f"{name}.done"
        gate.unlink(missing_ok=True)
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                        job_manifest(name, self.rng.randint(1, 3), gate))
        except ApiException as exc:
            if exc.status == 409:
                return False  # exists, or the old one is still being deleted
            raise
        return True

    def delete(self) -> bool:
        job = self._pick_job()
        if job is None:
            return False
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, job["metadata"]["name"])
        return True

    def recreate(self) -> bool:
        job = self._pick_job()
        if job is None:
            return False
        name = job["metadata"]["name"]
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        for _ in range(20):  # at once: the old pods are still there
            if self.create(name):
                return True
            time.sleep(0.05)
        return False

    def scale(self) -> bool:
        job = self._pick_job()
        if job is None:
            return False
        self.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, self.namespace, PLURAL,
                                                         job["metadata"]["name"],
                                                         {"spec": {"replicas": self.rng.randint(1, 3)}})
        return True

    def finish(self) -> bool:
        job = self._pick_job()
        if job is None:
            return False
        (self.gates / f"{job['metadata']['name']}.done").touch()
        return True

    def suspend(self) -> bool:
        job = self._pick_job()
        if job is None:
            return False
        now = ((job["spec"].get("runPolicy") or {}).get("suspend")) or False
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, job["metadata"]["name"],
                                                   {"spec": {"runPolicy": {"suspend": not now}}})
        return True

    # --- pods and nodes -----------------------------------------------------------------------------------

    def _pick_pod(self, role: str = "worker"):
        pods = [p for p in self.core.list_namespaced_pod(self.namespace, label_selector=f"elasticjob.dev/role={role}").items
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return self.rng.choice(pods) if pods else None

    def crash_worker(self) -> bool:
        from localcluster import faults

        pod = self._pick_pod()
        return pod is not None and faults.kill_pod(self.namespace, pod.metadata.name, signal.SIGKILL,
                                                   self.state_dir) > 0

    def force_delete(self) -> bool:
        pod = self._pick_pod(self.rng.choice(["worker", "worker", "rendezvous"]))
        if pod is None:
            return False
        self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
        self.force_deleted[pod.metadata.name] = time.monotonic()
        return True

    def evict(self) -> bool:
        pod = self._pick_pod()
        if pod is None:
            return False
        self.core.create_namespaced_pod_eviction(pod.metadata.name, self.namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.metadata.name}})
        return True

    def drain(self) -> bool:
        from localcluster import faults

        pod = self._pick_pod()
        if pod is None or any(what == "uncordon" for _, what, _ in self._undo):
            return False
        node = pod.spec.node_name
        faults.drain(self.core, node, timeout=10, namespace=self.namespace)
        self._undo.append((time.monotonic() + self.rng.uniform(5, 15), "uncordon", node))
        return True

    def lose_node(self, node: str, for_seconds: float) -> None:
        from localcluster import faults

        faults.node_loss(node, self.state_dir)
        self._undo.append((time.monotonic() + for_seconds, "restore", node))
        self.counts["node lost"] += 1

    def _run_undos(self, force: bool = False) -> None:
        from localcluster import faults

        now, left = time.monotonic(), []
        for when, what, node in self._undo:
            if not force and when > now:
                left.append((when, what, node))
            elif what == "uncordon":
                faults.cordon(self.core, node, False)
            else:
                faults.restore_node(node, self.state_dir)
        self._undo = left
