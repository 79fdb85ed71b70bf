"""Strangers at a training job's rendezvous store, on real nodes: a pod in the job's own namespace wearing the
job's labels (where the chart's jobLabelPolicy refuses it that, as it does when the operator is installed by the
chart, the same pod without them), and a pod of another namespace wearing them, each dial the store (by its Service's ClusterIP and by its pod's IP)
and write what failed or held jobs before (tests/e2e/intruder.py): torch's state closed with a waiter, a forged
stop, a stop count jumped, a decoder bomb, deep JSON. None of it lands; the job trains on to Succeeded with no
restart charged, no failure and no incident, and no step waits more than a second longer than usual.

Twice: with the operator's NetworkPolicies (the cluster's kube-network-policies drops the strangers' packets
first), and without them (--no-network-policy: nothing in the network stops the strangers, the store's own gate,
elasticjob_store/gate.py, refuses them alone, and the job shows it: status.rendezvous.refusedPeers and a Warning
Event StorePeerRefused). The second is in `make test`; the first in the slow tier (test_network_policies.py
already proves the policies' drops in `make test`).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from e2e_support import JOB_NAME, PULL_SECRETS, WORKER_IMAGE, job_manifest, train_args
from helpers import wait_for
from test_network_policies import intruders, pod_state  # noqa: F401 - intruders is a fixture
from test_training import STORE_POD, finish, ledger_story, rejoin_story, start

SOURCE = (Path(__file__).parent / "intruder.py").read_text()
STEP_SECONDS = 0.25
# 90 s of training at the nominal step time: the strangers' writes (5 at once from each, each refused after its
# client's 3 s timeout where the gate holds it, after importing torch in a pod on a loaded node) took 7-31 s. With
# the NetworkPolicies enforced (kube-network-policies queues each new connection to userspace) the steps are slower
# and 480 of them outlasted finish()'s 2 minutes.
STEPS = 360
# No step waits longer than this past the usual (the "no agent stalls more than 1 s").
STALL = 1.0


def stranger(name: str, labelled: bool = True) -> dict:
    """A pod wearing the job's labels (or none), idle until the test runs the intruder in it."""
    labels = {"elasticjob.dev/job-name": JOB_NAME, "elasticjob.dev/role": "worker"} if labelled else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 0, "imagePullSecrets": PULL_SECRETS,
                     "containers": [{"name": "probe", "image": WORKER_IMAGE, "imagePullPolicy": "IfNotPresent",
                                     "command": ["python", "-c", "import time; time.sleep(10**9)"]}]}}


def place(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Creates the stranger wearing the job's labels; where the chart's jobLabelPolicy refuses that (the job's own
    namespace, with the operator installed by the chart), without them. True: it wears them."""
    try:
        core.create_namespaced_pod(namespace, stranger(name))
        return True
    except ApiException as error:
        if error.status != 403 or "job-labels-reserved" not in str(error.body):
            raise
    core.create_namespaced_pod(namespace, stranger(name, labelled=False))
    return False


def intrude(configuration: client.Configuration, namespace: str, pod: str, host: str, port: int,
            run_id: str) -> dict[str, str]:
    """Runs the intruder in `pod`. A client of its own: stream() swaps its client's request function while it
    runs, and the test's shared client, used by other threads meanwhile, would be left speaking websocket."""
    with client.ApiClient(configuration) as api:
        out = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace,
                     command=["python", "-c", SOURCE, host, str(port), run_id],
                     stderr=False, stdin=False, stdout=True, tty=False)
    return json.loads(out.strip().splitlines()[-1])


def longest_wait(records: list[dict], since: float, until: float) -> float:
    """The longest time between two steps finished in [since, until] (rank 0's, one per step)."""
    times = sorted(r["time"] for r in records if r["rank"] == 0 and since <= r["time"] <= until)
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


@pytest.mark.parametrize("policies", [
    pytest.param("absent", id="gate-alone"),
    pytest.param("enforced", id="with-network-policies", marks=pytest.mark.slow),
])
def test_strangers_write_nothing_into_the_store_and_the_job_trains_on(
        real_nodes, operator_factory, jobs, progress, intruders, policies, request):  # noqa: F811 - the fixture
    if policies == "enforced":
        request.getfixturevalue("enforced_policies")  # skips where nothing enforces them, before any operator
    operator_factory(extra_args=["--no-network-policy"] if policies == "absent" else [])
    core = jobs.core
    strangers = [(jobs.namespace, "neighbour"), (intruders, "outsider")]
    labelled = {name: place(core, namespace, name) for namespace, name in strangers}
    assert labelled["outsider"], "the policy binds the watched namespaces only"
    # No straggler replacement: the strangers' pods load the nodes (importing torch), which made a worker's 3 ms
    # forward 9 times the other's and had it replaced; that is the straggler tests' subject, not this one's.
    manifest = job_manifest(jobs.namespace, train_args=train_args(STEPS, step_seconds=STEP_SECONDS),
                            stragglers={"enabled": False})
    before = start(jobs, progress, manifest, world_size=2)
    for namespace, name in strangers:
        wait_for(lambda: pod_state(core, namespace, name), 120, f"{name} Running",
                 until=lambda state: state.startswith("Running"))
    service = core.read_namespaced_service(STORE_POD, jobs.namespace).spec
    port = next(p.port for p in service.ports if p.name == "rendezvous")
    store_ip = jobs.pod(STORE_POD).status.pod_ip
    run_id = jobs.get()["metadata"]["uid"]
    attempts = [(namespace, name, host) for namespace, name in strangers for host in (service.cluster_ip, store_ip)]

    began = time.time()
    with ThreadPoolExecutor(len(attempts)) as pool:
        seen = list(pool.map(lambda a: intrude(jobs.api_client.configuration, a[0], a[1], a[2], port, run_id),
                             attempts))
    ended = time.time()
    print(f"strangers ({policies}): {len(attempts)} intruders, {ended - began:.1f} s to try every write")
    for (namespace, name, host), results in zip(attempts, seen):
        landed = [write for write, result in results.items() if not result.startswith("refused")]
        assert not landed, f"{name} ({namespace}) wrote {landed} into the store at {host}: {results}"
    assert jobs.status().get("phase") == "Running", "the strangers outlasted the training: raise STEPS"

    done = finish(jobs, progress, STEPS)
    status = jobs.status()
    assert status.get("restarts", 0) == 0 and not status.get("lastFailures"), status
    # What the intruders did: an incident from their writes on. One booked at the job's start, before the first write
    # (seen: a 0 s Rejoin as the operator completed the first round, 2 runs in 6), is not theirs: it is printed.
    incidents = status["goodput"].get("lastIncidents") or []
    theirs = [i for i in incidents if datetime.fromisoformat(i["startTime"]).timestamp() >= began]
    if len(theirs) < len(incidents):
        print(f"incidents before the first write (not the intruders'): {ledger_story(jobs, status)}")
    assert not theirs, f"{ledger_story(jobs, status)}\n{rejoin_story(jobs)}"
    waited = longest_wait(done.records, began, ended + 2)
    assert waited <= STEP_SECONDS + STALL, f"a step waited {waited:.2f}s while the strangers wrote"
    assert before.world_sizes() == {2} and done.world_sizes() == {2}, done
    if policies == "absent":  # the gate refused them, and the job says so
        assert status["rendezvous"].get("refusedPeers", 0) >= 1, status["rendezvous"]
        events = core.list_namespaced_event(jobs.namespace).items
        assert any(e.reason == "StorePeerRefused" for e in events), [e.reason for e in events]
