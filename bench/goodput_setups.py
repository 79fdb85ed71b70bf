"""The three ways bench/goodput.py runs the same training (examples/train_ddp.py, 3 workers, a step about every
0.13 s: a 0.1 s pause and a forward of 80 matmuls; a checkpoint every 10 steps), each behind the few operations its
faults need. Every setup runs the same command and mounts the same hostPath checkpoint dir, so a node marked sick
there fails the training on it in each (for_bad_nodes):

- OperatorJob: an ElasticJob through this operator, with its defaults or with `warmStarts: false`; under Kueue
  (where the cluster has it) so that a higher-priority job can preempt it;
- ByHand: torchrun agents in a StatefulSet with c10d rendezvous on pod 0 (goodput_by_hand.yaml), no operator.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness import STATE_DIR, WORKER_IMAGE, Api, wait
from localcluster import registry
from recovery import HOST_DIR, drain, manifest

STEP_SECONDS, CHECKPOINT_EVERY, REPLICAS = 0.1, 10, 3
# Compute in each forward (examples/train_ddp.py --forward-matmuls), the e2e's slow worker's figure
# (tests/e2e/test_bad_nodes.py): what a throttled CPU slows, so that the operator's straggler detector, which times
# each rank's forward (progress.watch in the script), sees a slow worker. About 30 ms on one core of a 2-core
# machine (the e2e's note; 28 ms on one thread of another): a step takes about 0.13 s. The 0.1 s pause is kept
# rather than cut to 0.07 s: the 3 workers then take about 0.7 of a core from the recoveries measured, not 0.9.
FORWARD_MATMULS = 80
# A sick node (tests/e2e's Faults.sicken): a file named as the node in this folder of the checkpoint dir makes every
# training process there exit 1, at its start and at each step. Both setups mount HOST_DIR/<namespace> at /ckpt.
CHECKPOINT_MOUNT, SICK_NODES_DIR = "/ckpt", "sick-nodes"
BAD_NODE_FLAGS = ("--forward-matmuls", str(FORWARD_MATMULS),
                  "--fail-on-marked-node", f"{CHECKPOINT_MOUNT}/{SICK_NODES_DIR}")
NODE_NAME = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}  # whose marker
# A job that lives through a fault every few minutes sets a budget to match: the default (3) ends the job at the
# fourth kill, 18 minutes into a 20-minute run (seen); the StatefulSet restarts its pods for ever.
MAX_RESTARTS = 100
AVOID_NODE_SECONDS = 240
BY_HAND = Path(__file__).resolve().parent / "goodput_by_hand.yaml"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
WORKER_CPU = 0.5  # under Kueue: 3 workers and the store (100m) fill the quota, so a preemptor needs preemption
SLEEPER = ["python3", "-c", "import time; time.sleep(3600)"]
Undo = Callable[[], None]


class Kueue:
    """A ClusterQueue with exactly the job's quota, a LocalQueue and two priorities in one namespace."""

    def __init__(self, api: Api, namespace: str):
        from localcluster import kueue_addon

        self.api, self.namespace = api, namespace
        self.custom = client.CustomObjectsApi(api.client)
        self.queue = f"cq-{namespace}"
        quota = f"{REPLICAS * WORKER_CPU + 0.1:.1f}"
        kueue_addon.ensure_cluster_queue(api.client, self.queue, cpu=quota, memory="8Gi", namespaces=[namespace])
        kueue_addon.ensure_local_queue(api.client, namespace, "lq", self.queue)
        self.low, self.high = self.priority("low", 10), self.priority("high", 1000)

    def priority(self, name: str, value: int) -> str:
        full = f"{name}-{self.namespace}"[:63]
        self.custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "WorkloadPriorityClass",
            "metadata": {"name": full}, "value": value})
        return full

    def label(self, job: dict, priority: str) -> dict:
        job["metadata"].setdefault("labels", {}).update(
            {"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": priority})
        return job

    def cleanup(self) -> None:
        for plural, name in (("workloadpriorityclasses", self.high), ("workloadpriorityclasses", self.low),
                             ("clusterqueues", self.queue)):
            try:
                self.custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
            except ApiException as error:
                if error.status != 404:
                    raise


def has_kueue(api: Api) -> bool:
    try:
        client.CustomObjectsApi(api.client).list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues")
        return True
    except ApiException as error:
        if error.status == 404:
            return False
        raise


def spread(pod_spec: dict, labels: dict[str, str]) -> None:
    """One worker a node where there is room (a lost node takes one), but never a worker left unscheduled."""
    pod_spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": labels}}}]}}


def for_bad_nodes(container: dict) -> dict:
    """The training flags and the env that the faults of nodes that stay bad need, the same in every setup."""
    container["command"] = [*container["command"], *BAD_NODE_FLAGS]
    container["env"] = [*container.get("env", []), NODE_NAME]
    return container


def sick_marker(ns: str, node: str) -> Path:
    """The file on this machine that makes `node` sick for the training in `ns`: the pods mount its folder."""
    return HOST_DIR / ns / SICK_NODES_DIR / node


def heal(ns: str, pod: str) -> None:
    """Puts a partitioned pod back on the network; a pod gone since (replaced by the operator) needs nothing."""
    from localcluster import partition as cut

    try:
        cut.heal(ns, pod, STATE_DIR)
    except ApiException as error:
        if error.status != 404:
            raise


def running(pods: list) -> list[str]:
    return sorted(p.metadata.name for p in pods
                  if p.status.phase == "Running" and p.metadata.deletion_timestamp is None)


class OperatorJob:
    store_pod = "train-rdzv"
    has_ledger = True

    def __init__(self, name: str, warm: bool, kueue: bool, spares: int = 0):
        self.name, self.warm, self.use_kueue, self.spares = name, warm, kueue, spares
        self.kueue: Kueue | None = None

    def job(self, ns: str) -> dict:
        job = manifest(ns, {}, replicas=REPLICAS, warm=self.warm, step_seconds=STEP_SECONDS,
                       checkpoint_every=CHECKPOINT_EVERY)
        spread(job["spec"]["template"]["spec"], {"elasticjob.dev/job-name": "train", "elasticjob.dev/role": "worker"})
        for_bad_nodes(job["spec"]["template"]["spec"]["containers"][0])
        job["spec"]["maxRestarts"] = MAX_RESTARTS
        if self.spares:
            job["spec"]["spares"] = self.spares
        # A partition, a sick node and a slow one each avoid a node; at the default 10 minutes three of them in a
        # row could close all 3 nodes to the job and leave a replacement Pending through the next fault.
        job["spec"]["failurePolicy"] = {"avoidNodeSeconds": AVOID_NODE_SECONDS}
        return job

    def start(self, api: Api, ns: str) -> None:
        job = self.job(ns)
        if self.use_kueue:
            self.kueue = Kueue(api, ns)
            job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": str(WORKER_CPU)}}
            self.kueue.label(job, self.kueue.low)
        api.create_job(ns, job)

    def workers(self, api: Api, ns: str) -> list[str]:
        return running(api.workers(ns, "train"))

    def scale(self, api: Api, ns: str, replicas: int) -> None:
        api.scale(ns, "train", replicas)

    def preempt(self, api: Api, ns: str) -> Undo | None:
        """A higher-priority job of one worker that the quota has no room for: Kueue preempts this one."""
        if self.kueue is None:
            return None
        preemptor = manifest(ns, {}, replicas=1, warm=False)
        preemptor["metadata"]["name"] = "preemptor"
        preemptor["spec"].update(minReplicas=1, maxReplicas=1)
        pod = preemptor["spec"]["template"]["spec"]
        pod["containers"][0].update(command=SLEEPER, resources={"requests": {"cpu": str(WORKER_CPU)}})
        pod.pop("volumes"), pod["containers"][0].pop("volumeMounts")
        api.create_job(ns, self.kueue.label(preemptor, self.kueue.high))
        return lambda: api.custom.delete_namespaced_custom_object("elasticjob.dev", "v1alpha1", ns, "elasticjobs",
                                                                  "preemptor")

    def ledger(self, api: Api, ns: str) -> dict | None:
        return api.status(ns, "train").get("goodput")

    def stop(self, api: Api, ns: str) -> None:
        drain(api, ns)
        if self.kueue is not None:
            self.kueue.cleanup()
            self.kueue = None


class ByHand:
    """torchrun agents in a StatefulSet, rendezvous on pod 0: no store of ours, no ledger."""

    store_pod = "train-0"  # pod 0's agent hosts torch's c10d store
    has_ledger = False

    def __init__(self, name: str, kueue: bool):
        self.name, self.use_kueue = name, kueue

    def objects(self, ns: str) -> list[dict]:
        service, stateful_set = yaml.safe_load_all(BY_HAND.read_text())
        pod = stateful_set["spec"]["template"]["spec"]
        pod["containers"][0]["image"] = WORKER_IMAGE
        for_bad_nodes(pod["containers"][0])
        pod["volumes"][0]["hostPath"]["path"] = str(HOST_DIR / ns)
        pod["imagePullSecrets"] = [{"name": registry.PULL_SECRET}]
        return [service, stateful_set]

    def start(self, api: Api, ns: str) -> None:
        service, stateful_set = self.objects(ns)
        api.core.create_namespaced_service(ns, service)
        client.AppsV1Api(api.client).create_namespaced_stateful_set(ns, stateful_set)

    def workers(self, api: Api, ns: str) -> list[str]:
        return running(api.core.list_namespaced_pod(ns, label_selector="app=train").items)

    def scale(self, api: Api, ns: str, replicas: int) -> None:
        client.AppsV1Api(api.client).patch_namespaced_stateful_set_scale("train", ns, {"spec": {"replicas": replicas}})

    def preempt(self, api: Api, ns: str) -> Undo | None:
        """What Kueue's preemption does to a PyTorchJob: every pod stopped, then all made again once readmitted
        (here: after the same hold as the operator's preemptor). Only where the other setups met Kueue."""
        if not self.use_kueue:
            return None
        self.scale(api, ns, 0)
        return lambda: self.scale(api, ns, REPLICAS)

    def ledger(self, api: Api, ns: str) -> dict | None:
        return None

    def stop(self, api: Api, ns: str) -> None:
        for pod in self.workers(api, ns):
            heal(ns, pod)
        client.AppsV1Api(api.client).delete_namespaced_stateful_set("train", ns)
        api.core.delete_namespaced_service("train", ns)
        wait(lambda: not api.core.list_namespaced_pod(ns).items, 90, "the pods gone", interval=0.5)

