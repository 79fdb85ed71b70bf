"""The phase and READY while a running job's store is lost and comes back, replayed reconcile by reconcile from pod
bodies as the API server holds them (issue 34).

Seen on real nodes, the store pod deleted while three workers trained on: `Running (StoreComingBack)`, then
`Pending (Waiting): waiting for the rendezvous store; 0/3 workers ready`, then `Running 1/3` within 4 s. The
workers have no readiness probe, so the kubelet holds their containers ready as long as they run; 0/3 means their
pods' Ready condition was False while their containers ran: the node lifecycle controller's MarkPodsNotReady
writes only that condition, and the kubelet puts it back pod by pod."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from factory import NOW, UID, job, observed, running_status

from elasticjob import naming, planner
from elasticjob.observe import pod_view

RUNNING = {"running": {"startedAt": "2026-01-01T11:00:05Z"}}


def pod(name: str, role: str, pod_ready: bool, containers_ready: bool, index: int | None = None) -> dict[str, Any]:
    """A Running pod: its Ready condition (anyone's word), its container status (the kubelet's)."""
    labels = {naming.ROLE_LABEL: role} | ({naming.INDEX_LABEL: str(index)} if index is not None else {})
    container = naming.WORKER_CONTAINER if role == naming.ROLE_WORKER else naming.RENDEZVOUS_CONTAINER
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels,
                         "ownerReferences": [{"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob",
                                              "name": "train", "uid": UID, "controller": True}]},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Running", "podIP": f"10.244.0.{index or 0}",
                       "conditions": [{"type": "Ready", "status": str(pod_ready)},
                                      {"type": "ContainersReady", "status": str(containers_ready)}],
                       "containerStatuses": [{"name": container, "ready": containers_ready, "state": RUNNING}]}}


def workers(pod_ready: list[bool], containers_ready: bool = True) -> list[dict[str, Any]]:
    return [pod(f"train-worker-{i}", naming.ROLE_WORKER, ready, containers_ready, i)
            for i, ready in enumerate(pod_ready)]


def store(serving: bool) -> list[dict[str, Any]]:
    return [pod("train-rdzv", naming.ROLE_RENDEZVOUS, serving, serving)]


def replay(steps, status: dict[str, Any]):
    """Each step one reconcile, 2 s apart, from the status the one before wrote."""
    job_status = status
    for i, (pods, *want) in enumerate(steps):
        now = NOW + timedelta(seconds=2 * i)
        result = planner.plan(job(job_status, replicas=3), observed([pod_view(p) for p in pods]), now)
        yield result, want
        job_status = result.status.model_dump(by_alias=True, mode="json")


# (pods, phase, reason, READY)
OBSERVED = [  # no readiness probe: the kubelet holds the workers' containers ready as long as they run
    (workers([True] * 3), "Running", "StoreComingBack", 3),  # the store pod gone
    (store(False) + workers([False] * 3), "Running", "StoreComingBack", 3),  # back, not serving; pods marked
    (store(True) + workers([True, False, False]), "Running", "Running", 3),  # serving; Ready returns pod by pod
    (store(True) + workers([True] * 3), "Running", "Running", 3),
]
PROBE_ASKS_THE_STORE = [  # the template's readiness probe fails while the store is away: the kubelet's own word
    (workers([True] * 3), "Running", "StoreComingBack", 3),
    (store(False) + workers([False] * 3, containers_ready=False), "Running", "StoreComingBack", 0),
    (store(True) + workers([False] * 3, containers_ready=False), "Running", "StoreComingBack", 0),  # catching up
    (store(True) + workers([True] * 3), "Running", "Running", 3),
]


@pytest.mark.parametrize("steps", [OBSERVED, PROBE_ASKS_THE_STORE], ids=["observed", "probe-asks-the-store"])
def test_a_job_that_trains_through_its_stores_return_is_never_pending(steps):
    for i, (result, (phase, reason, ready)) in enumerate(replay(steps, running_status())):
        seen = (result.status.phase, result.status.reason, result.status.ready_replicas)
        assert seen == (phase, reason, ready), f"step {i}: {result.status.message}"
        assert "Waiting" not in [e.reason for e in result.events], f"step {i}"


def test_the_message_says_the_store_is_coming_back_and_how_many_workers_run():
    (_, (result, _)) = replay(OBSERVED[:2], running_status())
    assert result.status.message == ("the rendezvous store is coming back at 10.96.0.42:29400; the workers train "
                                     "on and rejoin it; 3 running, 3/3 workers ready (min 1, max 3)")


def test_workers_never_ready_again_after_the_store_serves_are_waited_for():
    """The grace after the store serves again is RESTARTING_WINDOW; a job whose workers stay unready past it is
    Pending, waiting for ready workers, as any other."""
    unready = store(True) + workers([False] * 3, containers_ready=False)
    steps = [(store(False) + workers([False] * 3, containers_ready=False), "Running", "StoreComingBack", 0),
             *[(unready, "Running", "StoreComingBack", 0)] * 30,  # 60 s, 2 s apart
             (unready, "Pending", "Waiting", 0)]
    for i, (result, (phase, reason, ready)) in enumerate(replay(steps, running_status())):
        assert (result.status.phase, result.status.reason, result.status.ready_replicas) == (phase, reason, ready), \
            f"step {i}: {result.status.message}"


@pytest.mark.parametrize("pods, why", [
    (store(False) + workers([True] * 3), "a new job waits for its store"),
    (store(True) + workers([False] * 3, containers_ready=False), "a new job waits for ready workers"),
])
def test_a_job_that_never_ran_stays_pending(pods, why):
    pending = {"phase": "Pending", "reason": "Waiting", "startTime": "2026-01-01T11:00:00Z",
               "rendezvous": {"endpoint": "10.96.0.42:29400"}}
    ((result, _),) = replay([(pods,)], pending)
    assert result.status.phase == "Pending", why


def sidecar(ready: bool) -> dict[str, Any]:
    body = workers([True])[0]
    body["spec"]["initContainers"] = [{"name": "proxy", "restartPolicy": "Always"}, {"name": "setup"}]
    body["status"]["initContainerStatuses"] = [
        {"name": "proxy", "ready": ready, "state": RUNNING},
        {"name": "setup", "ready": False, "state": {"terminated": {"exitCode": 0}}}]  # a plain init container: done
    return body


@pytest.mark.parametrize("body, ready", [
    (workers([False])[0], True),  # Ready taken away by the node lifecycle controller: the containers run
    (workers([True], containers_ready=False)[0], False),
    ({**workers([True])[0], "status": {**workers([True])[0]["status"], "containerStatuses": [
        {"name": naming.WORKER_CONTAINER, "ready": True, "state": {"terminated": {"exitCode": 0}}}]}}, False),
    ({**workers([True])[0], "status": {"phase": "Pending"}}, False),  # no container status yet
    (sidecar(ready=False), False),  # a native sidecar counts, as in the kubelet's ContainersReady
    (sidecar(ready=True), True),
])
def test_ready_is_the_kubelets_container_readiness(body, ready):
    assert pod_view(body).containers_ready is ready


def test_a_job_restarting_when_its_store_is_lost_trains_on_and_is_not_pending():
    """Issue 51: a store lost while the job showed Restarting (a charged restart in the last minute, its
    replacement joined) made it Pending, waiting for the store, while its workers trained on."""
    restarting = running_status(phase="Restarting", reason="Restarting", restarts=1,
                                lastRestartTime=(NOW - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    ((result, _),) = replay([(workers([True] * 3),)], restarting)
    assert (result.status.phase, result.status.reason) == ("Running", "StoreComingBack"), result.status.message
