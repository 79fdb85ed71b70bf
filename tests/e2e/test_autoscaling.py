"""A HorizontalPodAutoscaler drives a job through its scale subresource, on the CPU its workers really use: the
kubelets' resource metrics, read by metrics-server (localcluster/manifests/metrics-server.yaml), for the HPA
controller in kube-controller-manager. Runs where the nodes are real (`make e2e`); elsewhere it says it skipped.

The load is switched from outside: train_ddp.py spins the CPU through each step while a file in the job's
checkpoint dir exists, and sleeps otherwise.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from e2e_support import CHECKPOINT_MOUNT, GROUP, HOST_ROOT, JOB_NAME, VERSION, job_manifest, summary, train_args
from helpers import wait_for
from test_training import start

MIN, MAX = 1, 3
CPU_REQUEST = "250m"
# Measured per worker pod: idle about 70m (28%; up to 47% with three nodes on two cores), the step's own work
# four times a second; busy up to a core (400%). At 100% idle worlds shrink to one and busy ones grow to MAX.
TARGET_UTILIZATION = 100
# Metrics every 10 s, a new pod's first rate after two scrapes, the HPA's 15 s sync, and the new world's start.
SCALE_TIMEOUT = 180
CHECKPOINT_EVERY = 5


def hpa_manifest(namespace: str) -> dict:
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": JOB_NAME, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "name": JOB_NAME},
            "minReplicas": MIN, "maxReplicas": MAX,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": TARGET_UTILIZATION}}}],
            # The HPA's default waits 5 minutes before a scale-down; a test cannot.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 15}},
        },
    }


@pytest.fixture
def resource_metrics(real_nodes, jobs) -> None:
    """metrics-server answers for every node (it is applied with the local real nodes and starts with them)."""
    groups = client.ApisApi(jobs.api_client).get_api_versions().groups
    if not any(g.name == "metrics.k8s.io" for g in groups):
        pytest.skip("no metrics-server: metrics.k8s.io is not served (kind's nodes run none)")
    nodes = {n.metadata.name for n in jobs.core.list_node().items}
    custom = client.CustomObjectsApi(jobs.api_client)

    def reported() -> set[str]:
        listed = custom.list_cluster_custom_object("metrics.k8s.io", "v1beta1", "nodes")
        return {item["metadata"]["name"] for item in listed["items"]}

    wait_for(reported, 120, f"metrics.k8s.io reporting every node {sorted(nodes)}",
             until=lambda seen: nodes <= seen, ignore=(client.ApiException,))


class Trajectory:
    """What the HPA asked for and what ran, seen at each poll: the job's spec.replicas and its live workers."""

    def __init__(self, jobs):
        self.jobs = jobs
        self.replicas: list[int] = []
        self.workers: list[int] = []

    def observe(self) -> dict:
        job = self.jobs.get()
        live = self.jobs.live_workers()
        self.replicas.append(job["spec"]["replicas"])
        self.workers.append(len(live))
        return job


def hpa_status(jobs) -> dict:
    hpa = client.AutoscalingV2Api(jobs.api_client).read_namespaced_horizontal_pod_autoscaler(JOB_NAME, jobs.namespace)
    return {"current": hpa.status.current_replicas, "desired": hpa.status.desired_replicas,
            "metrics": [m.resource.current.average_utilization for m in hpa.status.current_metrics or []
                        if m.resource],
            "conditions": [f"{c.type}={c.status} {c.reason}: {c.message}" for c in hpa.status.conditions or []]}


def wait_world(progress, jobs, trajectory, world_size: int, since: float, what: str) -> dict:
    def observe():
        trajectory.observe()
        return progress().first_after(since, world_size)

    try:
        return wait_for(observe, SCALE_TIMEOUT, what, interval=1.0)
    except AssertionError as err:
        raise AssertionError(f"{err}\nHPA: {hpa_status(jobs)}\njob: {summary(jobs.status())}") from None


def lost_steps(records: list[dict]) -> list[str]:
    """Each worker process that resumed from before the last checkpoint written when it started (rank 0 saves
    every CHECKPOINT_EVERY steps; a world stops before the next one's processes start)."""
    lost = []
    for started, resumed_from in sorted({(r["started"], r["resumed_from"]) for r in records}):
        done = [r["step"] for r in records if r["time"] < started]
        last_checkpoint = max(done, default=0) // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        if resumed_from < last_checkpoint:
            lost.append(f"started {started:.1f}: resumed from {resumed_from}, checkpoint {last_checkpoint}")
    return lost


@pytest.mark.slow
def test_an_hpa_scales_the_job_up_under_load_and_down_when_it_stops(
        resource_metrics, operator, jobs, progress, record_timing):
    load = HOST_ROOT / jobs.namespace / "busy"
    load.parent.mkdir(parents=True, exist_ok=True)
    load.touch()
    manifest = job_manifest(jobs.namespace, min_replicas=MIN, max_replicas=MAX, replicas=MIN, max_restarts=1,
                            train_args=train_args(100_000, checkpoint_every=CHECKPOINT_EVERY,
                                                  extra=("--busy-while", f"{CHECKPOINT_MOUNT}/busy")))
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": CPU_REQUEST}}
    trajectory = Trajectory(jobs)
    try:
        start(jobs, progress, manifest, world_size=MIN)
        client.AutoscalingV2Api(jobs.api_client).create_namespaced_horizontal_pod_autoscaler(
            jobs.namespace, hpa_manifest(jobs.namespace))
        loaded = time.time()
        up = wait_world(progress, jobs, trajectory, MAX, loaded, f"the HPA to grow the job to {MAX} under load")
        record_timing("HPA: load on -> first step at world size 3", up["time"] - loaded)
        load.unlink()
        idle = time.time()
        down = wait_world(progress, jobs, trajectory, MIN, idle, f"the HPA to shrink the job to {MIN} when idle")
        record_timing("HPA: load off -> first step at world size 1", down["time"] - idle)
    finally:
        load.unlink(missing_ok=True)
    status = jobs.status()
    assert (status.get("restarts"), status.get("infrastructureFailures")) == (0, 0), (
        f"scaling is no failure: {summary(status)}")
    assert not status.get("lastFailures"), status.get("lastFailures")
    assert MIN <= min(trajectory.replicas) and max(trajectory.replicas) <= MAX, trajectory.replicas
    assert max(trajectory.workers) <= MAX, f"more workers than maxReplicas: {trajectory.workers}"
    records = progress().records
    assert {r["world_size"] for r in records} <= set(range(MIN, MAX + 1)), {r["world_size"] for r in records}
    assert not lost_steps(records), lost_steps(records)
