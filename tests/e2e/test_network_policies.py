"""The operator's NetworkPolicies, enforced (kube-network-policies on every real node): a pod of another namespace,
even one carrying the job's labels, reaches neither port of a job's rendezvous store (by the Service's ClusterIP
or by the store pod's IP) nor any port of its workers, while the job itself trains to Succeeded: its workers
reach the store and each other, the operator (a pod of the test's namespace) the store's control port, and the
kubelet its readiness probe.

Each probe is one TCP connect: "open" (accepted), "refused" (a reset: nothing listens, but the packet got there)
or "timeout" (dropped: what a policy does). A worker is probed on a port nothing listens on, so "refused" says
it is reachable at all. The cluster's DNS is probed too, so that "timeout" means the policy, not a broken path.
Runs where the nodes are real; elsewhere (process-backed nodes, which enforce no policy) it says it skipped.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from e2e_support import JOB_NAME, PULL_SECRETS, WORKER_IMAGE, job_manifest, train_args
from helpers import wait_for
from test_training import STORE_POD, finish, start

CLUSTER_DNS = ("10.96.0.10", 53)
CLOSED_PORT = 1  # nothing listens there on a worker: a reset if the packet arrives
PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor

def connect(target):
    try:
        socket.create_connection((target[0], target[1]), timeout=3).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "timeout"

targets = json.loads(sys.argv[1])
with ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(connect, targets.values())))))
"""


def pod_state(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """The pod's phase, and why a container waits (the kubelet's words), for a failure's message."""
    status = core.read_namespaced_pod(name, namespace).status
    waiting = [f"{c.name}: {c.state.waiting.reason} {c.state.waiting.message or ''}".strip()
               for c in (status.container_statuses or []) if c.state and c.state.waiting]
    conditions = [f"{c.type}={c.status} {c.reason or ''}".strip() for c in status.conditions or []]
    return f"{status.phase} {waiting} {conditions}"


@pytest.fixture
def intruders(kube, cluster):
    """Another namespace, with the local registry's pull secret as the test's own has (without it an intruder ran
    only where a node already held the worker image: 401 from the registry where it did not), deleted at the end."""
    core, name = client.CoreV1Api(kube), f"intruders-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"elasticjob.dev/test": "true"})))
    try:
        wait_for(lambda: core.read_namespaced_service_account("default", name), 30,
                 f"the default ServiceAccount of namespace {name}", ignore=(ApiException,))
        if cluster.pulls_from_registry:
            from localcluster import registry
            from localcluster.layout import Layout

            root = Path(__file__).resolve().parents[2]
            core.create_namespaced_secret(name, registry.pull_secret(name, registry.password(Layout(root))))
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background", grace_period_seconds=0)


def intruder_pod(node: str) -> dict:
    """On a given node (the store's own node: the same bridge; another: across the nodes' routes), with the job's
    labels, which admit pods only in the job's own namespace."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"intruder-{node}",
                         "labels": {"elasticjob.dev/job-name": JOB_NAME, "elasticjob.dev/role": "worker"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "imagePullSecrets": PULL_SECRETS,
                     "containers": [{"name": "probe", "image": WORKER_IMAGE, "imagePullPolicy": "IfNotPresent",
                                     "command": ["python", "-c", "import time; time.sleep(10**9)"]}]}}


def probe(core: client.CoreV1Api, namespace: str, pod: str, targets: dict[str, tuple[str, int]]) -> dict[str, str]:
    out = stream(core.connect_get_namespaced_pod_exec, pod, namespace,
                 command=["python", "-c", PROBE, json.dumps(targets)],
                 stderr=True, stdin=False, stdout=True, tty=False)
    return json.loads(out.strip().splitlines()[-1])


def test_another_namespace_reaches_neither_the_store_nor_the_workers(enforced_policies, operator, jobs, progress, intruders):
    core, steps = jobs.core, 80
    nodes = [n.metadata.name for n in core.list_node().items]
    for node in nodes:
        core.create_namespaced_pod(intruders, intruder_pod(node))
    manifest = job_manifest(jobs.namespace, train_args=train_args(steps))
    before = start(jobs, progress, manifest, world_size=2)
    policies = client.NetworkingV1Api(jobs.api_client).list_namespaced_network_policy(jobs.namespace).items
    assert {"elasticjob-rendezvous", "elasticjob-workers"} <= {p.metadata.name for p in policies}

    service = core.read_namespaced_service(STORE_POD, jobs.namespace).spec
    port = next(p.port for p in service.ports if p.name == "rendezvous")
    control = next(p.port for p in service.ports if p.name == "control")
    service_ip = service.cluster_ip
    store = jobs.pod(STORE_POD)
    rank0 = jobs.pod(before.rank0_host())
    targets = {"service rendezvous": (service_ip, port), "service control": (service_ip, control),
               "store pod rendezvous": (store.status.pod_ip, port), "store pod control": (store.status.pod_ip, control),
               "rank 0 worker": (rank0.status.pod_ip, CLOSED_PORT), "cluster DNS": CLUSTER_DNS}
    blocked = {name: "timeout" for name in targets if name != "cluster DNS"}
    for node in nodes:
        pod = f"intruder-{node}"
        wait_for(lambda: pod_state(core, intruders, pod), 120, f"{pod} Running",
                 until=lambda state: state.startswith("Running"))
        seen = probe(core, intruders, pod, targets)
        assert seen == {**blocked, "cluster DNS": "open"}, (
            f"from {pod} (the store on {store.spec.node_name}, rank 0 on {rank0.spec.node_name}): {seen}")
    assert jobs.status().get("phase") == "Running", "the probes outlasted the training: raise its steps"
    finish(jobs, progress, steps)
