"""Two operator processes with `--leader-elect` against the real API server, under the chart's RBAC (replicas 2):
only the holder of the Lease reconciles; SIGKILL the leader and the other takes over and reconciles a change
within 15 s (the time is printed for docs/benchmarks.md); SIGTERM it and the other takes over at once (the
Lease is released). The pure rules and the loop: tests/unit/test_lease.py, tests/unit/test_leader_election.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from jobapi import GROUP, PLURAL, VERSION, create, job_manifest, pods, wait_pods
from kubernetes import client

from chart_rbac import allowed, service_account_kubeconfig
from helpers import wait_for

# Alone (make test runs these after the tier's parallel part): they time a failover against the Lease's 15 s.
pytestmark = pytest.mark.alone

FAILOVER_LIMIT = 15.0
LEADING = "is the leader; reconciling"
PERMISSION_ERRORS = ("Forbidden", "forbidden", " 403")


def identity(operator) -> str:
    return re.search(r"leader election: candidate (\S+) for Lease", operator.log_text()).group(1)


def holder(kube, namespace: str, name: str) -> str | None:
    return client.CoordinationV1Api(kube).read_namespaced_lease(name, namespace).spec.holder_identity


def start_pair(kube, cluster, namespace, install_rbac, operator_factory, tmp_path):
    """Two operators as the chart runs them (its ServiceAccount, its Lease); returns (leader, other, lease)."""
    values = {"replicas": 2, "watch": {"allNamespaces": False, "namespaces": [namespace]}}
    user = install_rbac(values, namespace)
    account = user.rsplit(":", 1)[1]  # the release's full name: the chart names the Lease after it
    # Create any Lease (RBAC cannot limit a create to a name), get and update only the release's own.
    for verb, name in (("create", ""), ("get", account), ("update", account)):
        wait_for(lambda: allowed(kube, user, verb, "coordination.k8s.io", "leases", "", namespace, name), 30,
                 f"{user} to be allowed to {verb} leases {name}")
    kubeconfig = service_account_kubeconfig(kube, Path(cluster.kubeconfig), namespace, account,
                                            tmp_path / "operator.kubeconfig")
    args = ["--leader-elect", "--leader-lease-name", account, "--operator-namespace", namespace]
    operators = [operator_factory(namespaces=[namespace], extra_args=args, env={"KUBECONFIG": str(kubeconfig)})
                 for _ in range(2)]
    for operator in operators:
        operator.wait_for_log("leader election: candidate", timeout=60)
    leading = wait_for(lambda: [LEADING in op.log_text() for op in operators], 60, "one operator to lead",
                       until=any)
    assert sum(leading) == 1, [op.log_tail() for op in operators]
    leader, other = operators if leading[0] else operators[::-1]
    assert holder(kube, namespace, account) == identity(leader)
    other.wait_for_log("this replica waits, not reconciling", timeout=10)
    return leader, other, account


def test_only_the_leader_reconciles_and_a_killed_one_is_replaced_within_15_s(
        api, kube, cluster, namespace, crds_installed, install_rbac, operator_factory, tmp_path):
    leader, other, lease = start_pair(kube, cluster, namespace, install_rbac, operator_factory, tmp_path)
    create(api, namespace, job_manifest("ha"))
    wait_pods(api, namespace, 2)
    wrote = f"[{namespace}/ha] phase "
    wait_for(leader.log_text, 30, "the leader to write the job's phase", until=lambda log: wrote in log)
    # The waiting one says, at debug level, that it holds back; nothing else about the job.
    about_job = [line for line in other.log_text().splitlines() if f"[{namespace}/ha]" in line]
    assert all("not the leader: not reconciling" in line for line in about_job), other.log_tail()

    leader.kill()
    killed = time.monotonic()
    api[0].patch_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "ha", {"spec": {"replicas": 3}})
    wait_for(lambda: [p.metadata.name for p in pods(api, namespace)], FAILOVER_LIMIT + 10,
             "the other operator to create the third worker", until=lambda names: "ha-worker-2" in names,
             interval=0.1)
    reconciled = time.monotonic() - killed
    took = other.log_text()
    assert LEADING in took and "took the Lease from" in took, other.log_tail()
    print(f"\nFAILOVER: leader SIGKILLed -> the other operator's reconcile created ha-worker-2 in {reconciled:.1f} s")
    assert reconciled < FAILOVER_LIMIT, f"failover took {reconciled:.1f} s:\n{other.log_tail()}"
    assert holder(kube, namespace, lease) == identity(other)
    assert client.CoordinationV1Api(kube).read_namespaced_lease(lease, namespace).spec.lease_transitions >= 1
    denied = [line for line in took.splitlines() if any(m in line for m in PERMISSION_ERRORS)]
    assert not denied, "\n".join(denied[:10])


def test_a_leader_stopped_cleanly_hands_over_at_once(
        api, kube, cluster, namespace, crds_installed, install_rbac, operator_factory, tmp_path):
    leader, other, lease = start_pair(kube, cluster, namespace, install_rbac, operator_factory, tmp_path)
    stopping = time.monotonic()
    leader.assert_clean_exit()  # SIGTERM: exit 0, a clean log, the Lease released
    assert "released Lease" in leader.log_text(), leader.log_tail()
    other.wait_for_log(LEADING, timeout=5)
    handed = time.monotonic() - stopping
    print(f"\nHANDOVER: leader SIGTERMed -> the other leads after {handed:.1f} s (stop included)")
    assert "took the Lease from nobody (released)" in other.log_text(), other.log_tail()
    assert holder(kube, namespace, lease) == identity(other)
    create(api, namespace, job_manifest("after"))
    wait_pods(api, namespace, 2, running=False)
