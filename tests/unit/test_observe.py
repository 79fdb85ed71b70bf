"""Observed pods as the planner sees them, from real pod bodies and real torchrun output."""

from __future__ import annotations

import pytest

from elasticjob.agent_messages import parse_agent_message
from elasticjob.observe import pod_view, service_view

# The tail of a torchrun agent's log after its worker exited 3 on every restart (torch 2.13, measured).
GAVE_UP = """E1122 23:01:44.105000 18 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 0 (pid: 18) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train_ddp.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_23:01:44
  host      : train-worker-0
  rank      : 0 (local_rank: 0)
  exitcode  : 3 (pid: 18)
  error_file: <N/A>
============================================================"""
STORE_LOST = ('{"message": {"message": "RendezvousConnectionError: The connection to the C10d store has failed. '
              'See inner exception for details.", "extraInfo": {"timestamp": "1795388043"}}}')


def pod(phase="Running", terminated=None, **extra):
    state = {"terminated": terminated} if terminated else {"running": {}}
    body = {"metadata": {"name": "train-worker-1", "uid": "u1", "labels": {
                "elasticjob.dev/job-name": "train", "elasticjob.dev/role": "worker",
                "elasticjob.dev/replica-index": "1"}},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(phase == "Running")}],
                       "containerStatuses": [{"name": "worker", "state": state}]}}
    body["status"].update(extra)
    return body


@pytest.mark.parametrize("message, gave_up, code", [
    (GAVE_UP, True, 3),
    ("E1122 23:01:40.1 18 api.py:1002] failed (exitcode: 3) local_rank: 0\n"
     "E1122 23:01:44.1 18 api.py:1002] failed (exitcode: -9) local_rank: 0", False, -9),
    (STORE_LOST, False, None),
    # The workload's own words, in the same log: not torchrun's format, so they name no code.
    ("failed (exitcode: 3) local_rank: 0", False, None),
    ("loss=nan, exitcode: 3", False, None),
    (GAVE_UP.replace("  exitcode  : 3 (pid: 18)", "exitcode: 7"), True, 3),  # its last "failed" line then
    ("ChildFailedError exitcode: 3", False, None),
    ("", False, None),
])
def test_parse_agent_message(message, gave_up, code):
    assert parse_agent_message(message) == (gave_up, code)


def test_running_worker():
    view = pod_view(pod())
    assert (view.name, view.role, view.index, view.phase, view.ready, view.node) == (
        "train-worker-1", "worker", 1, "Running", True, "node-a")
    assert view.active and view.exit_code is None


def test_agent_that_gave_up_reports_the_workers_exit_code():
    view = pod_view(pod("Failed", {"exitCode": 1, "reason": "Error", "message": GAVE_UP,
                                      "finishedAt": "2026-11-22T23:01:45Z"}))
    assert (view.exit_code, view.worker_exit_code, view.agent_gave_up) == (1, 3, True)
    assert view.finished_at.isoformat() == "2026-11-22T23:01:45+00:00"


def test_killed_pod_keeps_the_container_exit_code():
    view = pod_view(pod("Failed", {"exitCode": 137, "reason": "Error"}))
    assert (view.worker_exit_code, view.agent_gave_up, view.says_store_lost) == (137, False, False)


def test_a_killed_agent_is_not_blamed_on_a_worker_failure_it_survived():
    # The termination message is the log's tail: an earlier in-place restart's line is still in it.
    message = "E1123 21:33:06.225000 1 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 6)\nrank 0/1 resuming"
    view = pod_view(pod("Failed", {"exitCode": 137, "reason": "Error", "message": message}))
    assert (view.exit_code, view.worker_exit_code, view.agent_gave_up) == (137, 137, False)


def test_a_killed_agent_did_not_lose_its_store_for_a_heartbeat_it_once_missed():
    message = ("W1123 21:40:02.1 1 dynamic_rendezvous.py:1350] The node '10.244.0.3_1_0' has failed to send a "
               "keep-alive heartbeat to the rendezvous 'run' due to an error of type RendezvousConnectionError.")
    view = pod_view(pod("Failed", {"exitCode": 137, "reason": "Error", "message": message}))
    assert (view.says_store_lost, view.worker_exit_code) == (False, 137)


def test_a_pod_that_says_it_lost_its_store_only_says_so():
    assert pod_view(pod("Failed", {"exitCode": 1, "message": STORE_LOST})).says_store_lost


def test_the_stores_last_restart_in_place_is_seen():
    body = pod("Running")
    body["metadata"]["labels"]["elasticjob.dev/role"] = "rendezvous"
    body["status"]["containerStatuses"] = [{"name": "rendezvous", "state": {"running": {}}, "lastState": {
        "terminated": {"exitCode": 137, "finishedAt": "2026-11-22T23:01:45Z"}}}]
    assert pod_view(body).restarted_at.isoformat() == "2026-11-22T23:01:45+00:00"


@pytest.mark.parametrize("extra, disruption", [
    ({"reason": "Evicted"}, "Evicted"),
    ({"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]},
     "Preempted"),
    ({"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]},
     "NodeLost"),
    ({}, None),
])
def test_disruptions(extra, disruption):
    assert pod_view(pod("Failed", {"exitCode": 137}, **extra)).disruption == disruption


def test_unschedulable():
    body = pod("Pending")
    body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/3 nodes are available: 3 Insufficient cpu."}]
    assert pod_view(body).unschedulable == "0/3 nodes are available: 3 Insufficient cpu."


def test_terminating():
    body = pod()
    body["metadata"]["deletionTimestamp"] = "2026-11-22T23:00:00Z"
    view = pod_view(body)
    assert view.deleting and not view.active


def test_service_without_ip():
    assert service_view({"metadata": {"name": "s"}, "spec": {"clusterIP": "None"}}).cluster_ip is None
    assert service_view({"metadata": {"name": "s"}, "spec": {"clusterIP": "10.96.0.9"}}).cluster_ip == "10.96.0.9"


@pytest.mark.parametrize("last_exit, backed_off", [(137, True), (1, False)])
def test_a_container_held_back_after_a_kill_is_told_from_one_that_cannot_start(last_exit, backed_off):
    body = pod()
    body["status"]["containerStatuses"][0].update({
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": last_exit, "finishedAt": "2026-01-01T12:00:00Z"}}})
    assert pod_view(body).killed_and_backed_off is backed_off
    assert not pod_view(pod()).killed_and_backed_off


def test_a_container_that_cannot_start_is_named_with_the_kubelets_words():
    body = pod(phase="Pending")
    body["status"]["initContainerStatuses"] = [{"name": "elasticjob-kit", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "elasticjob-operator:0.1.0"'}}}]
    body["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "PodInitializing"}}
    assert pod_view(body).cannot_start == ('container elasticjob-kit: ImagePullBackOff: Back-off pulling image '
                                              '"elasticjob-operator:0.1.0"')
    assert pod_view(pod()).cannot_start is None


def test_a_long_pull_error_keeps_the_image_and_the_registrys_answer():
    # The kubelet's words for a pull refused by a registry (containerd's error, as seen on real nodes).
    message = ('Back-off pulling image "10.244.0.1:5000/elasticjob/elasticjob-worker:0.1.0-cpu": ErrImagePull: failed '
               'to pull and unpack image "10.244.0.1:5000/elasticjob/elasticjob-worker:0.1.0-cpu": failed to resolve '
               'reference "10.244.0.1:5000/elasticjob/elasticjob-worker:0.1.0-cpu": pulling from host '
               '10.244.0.1:5000 failed with status code [manifests 0.1.0-cpu]: 401 Unauthorized')
    body = pod(phase="Pending")
    body["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": message}}
    seen = pod_view(body).cannot_start or ""
    assert seen.startswith('container worker: ImagePullBackOff: Back-off pulling image "10.244.0.1:5000/elasticjob/')
    assert seen.endswith("401 Unauthorized")
    body["status"]["containerStatuses"][0]["state"]["waiting"]["message"] = "x" * 1000 + message
    longer = pod_view(body).cannot_start or ""
    assert " ... " in longer and longer.endswith("401 Unauthorized") and len(longer) < 500


@pytest.mark.parametrize("case, ready_changed, expected", [
    ("turned not ready after its start: a probe that failed after passing", "2026-01-01T12:00:09Z",
     "2026-01-01T12:00:09+00:00"),
    ("not ready since before its start: never ready yet", "2026-01-01T11:59:58Z", None),
    ("ready", None, None),
])
def test_a_pod_that_lost_its_readiness_after_its_start_is_told_from_one_not_ready_yet(case, ready_changed,
                                                                                       expected):
    body = pod(conditions=[{"type": "Ready", "status": "False"},
                           {"type": "ContainersReady", "status": "False" if ready_changed else "True",
                            "lastTransitionTime": ready_changed or "2026-01-01T12:00:01Z"}],
               containerStatuses=[{"name": "worker", "ready": False,
                                   "state": {"running": {"startedAt": "2026-01-01T12:00:00Z"}}}])
    lost = pod_view(body).lost_ready_at
    assert (lost.isoformat() if lost else None) == expected, case


def test_a_silent_nodes_pods_marked_not_ready_by_the_control_plane_did_not_lose_readiness():
    """The node lifecycle controller sets the Ready condition alone; ContainersReady is the kubelet's word."""
    body = pod(conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T12:00:09Z"},
                           {"type": "ContainersReady", "status": "True"}],
               containerStatuses=[{"name": "worker", "ready": True,
                                   "state": {"running": {"startedAt": "2026-01-01T12:00:00Z"}}}])
    assert pod_view(body).lost_ready_at is None
