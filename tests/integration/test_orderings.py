"""The orderings of a real shared cluster, each one a defect the operator once had, against a real API server.

Stale bodies, a job recreated under the same name, a job that finished while a pod never started, a drain of
slow pods, and pods held by a finalizer. Refusals (Pod Security, quotas) are in test_refusals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from datetime import UTC, datetime

import pytest
from jobapi import (
    GROUP,
    HOST_MOUNT,
    PLURAL,
    ROOT,
    VERSION,
    create,
    get_job,
    host_dir,
    job_manifest,
    one_per_node_cpu,
    pods,
    status_of,
    store_millicores,
    wait_phase,
    wait_pods,
    with_host_dir,
)

from elasticjob import k8s
from elasticjob.controller.context import Context, JobMemory, job_logger
from elasticjob.controller.mirror import Mirror
from elasticjob.controller.reconcile import reconcile_fresh
from elasticjob.controller.stores import StoreWatches
from elasticjob.domain import Settings
from elasticjob.rendezvous_client import StoreClient
from helpers import wait_for

LOG = logging.getLogger("test")
IGNORE_SIGTERM = ["python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                  "time.sleep(3600)"]


def reconcile_once(kube, body: dict) -> None:
    """One reconcile in this process, from exactly the body given, against the real API server."""
    ctx = Context(kube=k8s.Kube(kube), mirror=Mirror(), stores=StoreClient(b"test-key" * 4),
                  settings=Settings(network_policy=False), logger=LOG, instance="test")
    ctx.watches = StoreWatches(ctx.stores, lambda key: None)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])

    async def run():
        await reconcile_fresh(ctx, JobMemory(), body, job_logger(LOG, key))
        await asyncio.gather(*ctx._tasks, return_exceptions=True)
        ctx.watches.stop_all()
        await ctx.stores.close()

    asyncio.run(run())


def events(api, namespace: str, reason: str) -> list:
    return [e for e in api[1].list_namespaced_event(namespace).items
            if e.reason == reason and e.involved_object.kind == "ElasticJob"]


# --- stale bodies ----------------------------------------------------------------------------------------


def test_a_reconcile_from_a_stale_body_never_writes_it_back(kube, api, namespace, crds_installed):
    stale = create(api, namespace, job_manifest("train"))
    # Written meanwhile by an earlier reconcile: a failure on record, the restart it cost.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    api[0].patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "train", {"status": {
        "phase": "Restarting", "reason": "Restarting", "restarts": 2, "lastRestartTime": now,
        "startTime": now, "countedFailures": ["uid-of-a-failed-pod"],
        "lastFailures": [{"pod": "train-worker-1", "uid": "uid-of-a-failed-pod", "reason": "Error"}]}})
    reconcile_once(kube, stale)
    status = status_of(api, namespace, "train")
    assert status["restarts"] == 2, "a reconcile that began before the write must not undo it"
    assert [f["uid"] for f in status["lastFailures"]] == ["uid-of-a-failed-pod"]
    assert status["observedGeneration"] == 1


def test_scale_right_after_create_is_not_undone_by_the_replicas_default(kube, api, namespace, crds_installed):
    manifest = job_manifest("train")
    del manifest["spec"]["replicas"]
    stale = create(api, namespace, manifest)
    api[0].patch_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "train", {"spec": {"replicas": 1}})
    reconcile_once(kube, stale)
    assert get_job(api, namespace, "train")["spec"]["replicas"] == 1


# --- ownership -------------------------------------------------------------------------------------------


def hold(api, namespace: str, names: list[str], finalizers: list[str]) -> None:
    """Set the pods' finalizers (a merge patch: a strategic one would merge an empty list away)."""
    for name in names:
        api[1].patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": finalizers}},
                                    _content_type="application/merge-patch+json")


def test_a_job_recreated_under_the_same_name_does_not_inherit_the_old_ones_pods(api, namespace, operator):
    # Both workers exit 0 once both run: one exiting before the other started would have it removed unstarted.
    gate = host_dir(namespace)
    create(api, namespace, with_host_dir(job_manifest("train", command=[
        "python", "-c", f"import os, time\nwhile not os.path.exists('{HOST_MOUNT}/go'): time.sleep(0.2)"]), namespace))
    wait_pods(api, namespace, 2)
    (gate / "go").write_text("go")
    try:
        wait_phase(api, namespace, "train", "Succeeded", timeout=90)
    finally:
        shutil.rmtree(gate, ignore_errors=True)
    leftovers = [p.metadata.name for p in pods(api, namespace)]
    assert len(leftovers) == 2, "completed workers stay with cleanPodPolicy Running"
    hold(api, namespace, leftovers, ["elasticjob.dev/test-hold"])  # a slow garbage collector
    try:
        api[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train")
        wait_for(lambda: [j for j in api[0].list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]],
                 30, "the old job gone", until=lambda items: not items)
        new = create(api, namespace, job_manifest("train"))
        uid = new["metadata"]["uid"]
        # It runs a store and workers of its own at once, under other names while the old ones hold theirs; the
        # old job's completed workers do not make it Succeeded.
        status = wait_for(lambda: status_of(api, namespace, "train"), 60, "the new job running on its own pods",
                          until=lambda s: s.get("phase") == "Running" and s.get("readyReplicas") == 2)
        assert not status.get("completionTime") and status["restarts"] == 0, status
        assert not events(api, namespace, "Succeeded") or all(
            e.involved_object.uid != uid for e in events(api, namespace, "Succeeded"))
        own = [p for p in pods(api, namespace) if p.metadata.owner_references[0].uid == uid]
        assert sorted(p.metadata.name for p in own) == [f"train-worker-0-{uid[:5]}", f"train-worker-1-{uid[:5]}"]
    finally:
        hold(api, namespace, [n for n in leftovers if n in {p.metadata.name for p in
                                                             api[1].list_namespaced_pod(namespace).items}], [])
    wait_phase(api, namespace, "train", "Running")


@contextlib.contextmanager
def garbage_collector_stopped():
    """SIGSTOP the local cluster's kube-controller-manager (and its supervisor): owners go, dependents stay."""
    group = int((ROOT / ".localcluster" / "pids" / "controller-manager.pid").read_text().split()[0])
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)


def test_what_an_earlier_job_left_is_removed_when_the_garbage_collector_does_not(api, namespace, operator, cluster):
    if cluster.kind != "local":
        pytest.skip("stops the local cluster's controller-manager")
    old = create(api, namespace, job_manifest("train"))
    wait_pods(api, namespace, 2)
    core = api[1]

    def left() -> list[str]:
        found = core.list_namespaced_pod(namespace).items + core.list_namespaced_service(namespace).items
        owned = [o for o in found if any(r.uid == old["metadata"]["uid"] for r in o.metadata.owner_references or [])]
        return [f"{type(o).__name__}/{o.metadata.name}" for o in owned if o.metadata.deletion_timestamp is None]

    with garbage_collector_stopped():
        api[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train")
        wait_for(lambda: api[0].list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"], 30,
                 "the old job gone", until=lambda items: not items)
        assert len(left()) == 4, left()  # the store, two workers, the Service: nothing collects them
        new = create(api, namespace, job_manifest("train"))
        wait_for(left, 90, "what the old job left removed by the operator", until=lambda found: not found)
    # The Event follows the delete: it may land a moment after the objects are gone.
    reasons = wait_for(lambda: [e for e in events(api, namespace, "DeletedLeftover")
                                if e.involved_object.uid == new["metadata"]["uid"]],
                       30, "a DeletedLeftover Event on the new job", until=bool)
    assert old["metadata"]["uid"] in reasons[0].message, reasons
    running = wait_pods(api, namespace, 2, timeout=90)
    assert {p.metadata.owner_references[0].uid for p in running} == {new["metadata"]["uid"]}
    wait_phase(api, namespace, "train", "Running")


# --- success while a pod never started -------------------------------------------------------------------


# Never beside other tests: it sizes its workers to the nodes' free CPU (make test runs it after the parallel part).
@pytest.mark.alone
def test_success_does_not_wait_for_a_worker_that_never_started(api, namespace, operator, cluster):
    if cluster.kind != "local":
        pytest.skip("sizes requests to the local cluster's nodes")
    # One worker per node fits, the store beside one of them (real nodes have this machine's 2 CPUs: "a node's
    # CPU less one" let two workers share a node, and every worker started).
    nodes, cpu = one_per_node_cpu(api[1], margin=store_millicores())
    count = nodes + 1  # one more than fits
    finish = ["python", "-c", "import time; time.sleep(2)"]
    create(api, namespace, job_manifest("train", command=finish, replicas=count, maxReplicas=count,
                                        resources={"requests": {"cpu": cpu}},
                                        runPolicy={"activeDeadlineSeconds": 600}))
    status = wait_phase(api, namespace, "train", "Succeeded", timeout=120)
    assert status["reason"] == "Succeeded"
    wait_for(lambda: [p for p in pods(api, namespace) if p.status.phase == "Pending"], 30,
             "the unstarted worker removed", until=lambda pending: not pending)
    assert events(api, namespace, "RemovedUnstarted")


# --- a drain of slow pods --------------------------------------------------------------------------------


def test_a_drain_of_slow_pods_counts_each_eviction_once(api, namespace, operator):
    count = 12  # more than the 10 failures status.lastFailures keeps
    manifest = job_manifest("train", command=IGNORE_SIGTERM, replicas=count, maxReplicas=count,
                            resources={"requests": {"cpu": "10m"}})
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 15
    create(api, namespace, manifest)
    workers = wait_pods(api, namespace, count, timeout=120)
    for pod in workers:
        api[1].create_namespaced_pod_eviction(pod.metadata.name, namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.metadata.name}})
    evicted = {p.metadata.uid for p in workers}
    # The pods ignore SIGTERM: they linger terminating for their whole grace period, seen again and again.
    wait_for(lambda: {p.metadata.uid for p in api[1].list_namespaced_pod(namespace).items}, 90,
             "the evicted pods to be gone", until=lambda uids: not uids & evicted)
    status = status_of(api, namespace, "train")
    assert status["infrastructureFailures"] == count and status["restarts"] == 0
    assert len(events(api, namespace, "Evicted")) == count
    wait_pods(api, namespace, count, timeout=120)


# --- pods held by a finalizer on a healthy node ----------------------------------------------------------


def test_a_pod_held_by_a_finalizer_on_a_ready_node_is_not_force_deleted(api, namespace, operator):
    create(api, namespace, job_manifest("train"))
    wait_pods(api, namespace, 2)
    hold(api, namespace, ["train-worker-1"], ["elasticjob.dev/test-hold"])
    try:
        api[1].delete_namespaced_pod("train-worker-1", namespace, grace_period_seconds=1)
        deleted_at = time.monotonic()
        # Past the force-delete threshold (15 s) and past a reconcile after it (the operator wakes at 15 s).
        wait_for(lambda: time.monotonic() - deleted_at, 60, "25 s past the deletion", until=lambda t: t > 25)
        assert api[1].read_namespaced_pod("train-worker-1", namespace).metadata.deletion_timestamp
        # Its kubelet confirmed the containers stopped; what holds the pod is a finalizer, on purpose.
        assert not events(api, namespace, "ForceDeleted"), "a kubelet can confirm: no force delete"
    finally:
        hold(api, namespace, ["train-worker-1"], [])
    wait_pods(api, namespace, 2, timeout=60)


# --- the operator killed between two writes -----------------------------------------------------------------


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8])
def test_an_operator_killed_while_a_job_converges_leaves_no_duplicate_and_no_double_count(
        api, namespace, operator_factory, cluster, delay):
    """SIGKILL at a moment while pods are being created and a failure is being recorded: the next operator
    finishes the work from what it observes, creating no pod twice and counting the failure once."""
    if cluster.kind != "local":
        pytest.skip("kills a worker through the local cluster's faults")
    import time as clock

    from localcluster import faults

    first = operator_factory()
    create(api, namespace, job_manifest("train", replicas=3))
    wait_pods(api, namespace, 3)
    faults.kill_pod(namespace, "train-worker-1", signal.SIGKILL, ROOT / ".localcluster")
    started = clock.monotonic()
    wait_for(lambda: clock.monotonic() - started, 5, f"{delay}s into the recovery", until=lambda t: t >= delay)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    first.check_log, first.exit_code = False, 0
    operator_factory().wait_for_log("watches synced", timeout=60)
    status = wait_for(lambda: status_of(api, namespace, "train"), 60, "the failure counted and replaced",
                      until=lambda s: s.get("restarts") == 1 and s.get("readyReplicas") == 3)
    workers = wait_pods(api, namespace, 3)
    assert sorted(p.metadata.name for p in workers) == ["train-worker-0", "train-worker-1", "train-worker-2"]
    assert [f["pod"] for f in status["lastFailures"]] == ["train-worker-1"], status["lastFailures"]
    assert status["restarts"] == 1
