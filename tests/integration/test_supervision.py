"""Control-plane components that exit by themselves come back, as a kubelet restarts static pods.

kube-scheduler exits when it takes its cache for corrupt, which happened right after API server restarts in
the soak; without a restart nothing was scheduled any more.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from jobapi import pod_spec
from kubernetes import client

from helpers import wait_for

# Never beside other tests (make test runs these after the tier's parallel part):
# it kills the scheduler.
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]


def scheduler_process(layout) -> int:
    """The kube-scheduler binary's pid (a child of its supervising loop)."""
    from localcluster import sessions

    leader = sessions.read_pid(layout, "scheduler")
    members = [pid for pid in sessions.session_members(leader) if "kube-scheduler" in sessions.cmdline(pid)
               and not sessions.cmdline(pid).startswith("bash")]
    assert members, f"no kube-scheduler in session {leader}"
    return members[0]


def test_a_scheduler_that_exits_is_restarted_and_schedules_again(cluster, kube, namespace):
    if cluster.kind != "local":
        pytest.skip("kills a local control-plane process")
    from localcluster.layout import Layout

    layout = Layout(ROOT)
    first = scheduler_process(layout)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: scheduler_process(layout), 30, "a new kube-scheduler process", until=lambda pid: pid != first,
             ignore=(AssertionError,))
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after"},
                                           "spec": pod_spec([{"name": "c", "command": ["sleep", "60"]}],
                                                            terminationGracePeriodSeconds=0)})
    wait_for(lambda: core.read_namespaced_pod("after", namespace).spec.node_name, 60, "the pod scheduled")


def test_only_the_components_that_may_exit_are_supervised():
    from localcluster import sessions

    assert sessions.supervised("scheduler", ["kube-scheduler", "--x"])[:2] == ["bash", "-c"]
    assert sessions.supervised("scheduler", ["kube-scheduler", "--x"])[-2:] == ["kube-scheduler", "--x"]
    assert sessions.supervised("etcd", ["etcd"]) == ["etcd"]
