"""The fleet's start with processes that really run (issue 37), for bench/fleet.py --processes N.

N jobs of 4 workers created at once on the local cluster's real nodes, through the operator (with the kit and
the pull secret, as the chart runs it) and through the bare client (bench/fleet_cluster.py: the Service, the store
pod and the workers, the operator's manifests, no kit), alternated operator, bare, operator, bare, ... so that
drift hits both alike. Every pod runs a real process: the store is the real one (`python -m elasticjob_store` in
the worker image, which imports torch), and each worker runs the worker image's Python (--process-workers):

- sleep: Python that sleeps (the default: a 2-core, 23 GB machine holds 40 stores importing torch, about
  143 MiB each unshared, but not 200 such processes);
- torch: Python that imports torch, then sleeps (about 28 GB at 40 jobs);
- torchrun: torchrun of a script that sleeps, from a shell (the kit's launcher and warm starts on the operator's
  side, as for a real job: each worker pod also gets the kit's init container; agents import torch; with
  spec.kit Image a shell's torchrun runs as written, cold).

Timed until every worker is Running, as bench/fleet.py's converge. After each run the jobs, pods and
EndpointSlices are read once and bench/fleet_ledger.py says where each job's start went.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kubernetes import client

import fleet_ledger
from fleet_cluster import WORKERS, BareClient, Watch, create_jobs, namespace, running
from harness import GROUP, KIT_ARGS, PLURAL, ROOT, STATE_DIR, VERSION, WORKER_IMAGE, Api, Operator, wait
from localcluster import registry
from localcluster.layout import Layout

WORKER_SELECTOR = "elasticjob.dev/role=worker"
SLEEP = "import time; time.sleep(3600)"
WORKER_COMMANDS = {
    "sleep": ["python", "-c", SLEEP],
    "torch": ["python", "-c", f"import torch; {SLEEP}"],
    # A shell running torchrun: the kit routes it through its launcher (elasticjob/kit.py route).
    "torchrun": ["sh", "-c", f"printf '{SLEEP}\\n' > /tmp/sleep.py && torchrun /tmp/sleep.py"],
}


def job_manifest(name: str, workers: str, kit: str = "Copy") -> dict:
    """4 workers of the worker image; no rendezvous image, so the store runs in the worker image too. `kit`:
    spec.kit (Image: the worker image's own packages, no init container)."""
    container = {"name": "worker", "image": WORKER_IMAGE, "command": WORKER_COMMANDS[workers],
                 "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {"minReplicas": 1, "maxReplicas": WORKERS, "replicas": WORKERS, "maxRestarts": 10000, "kit": kit,
                     "template": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [container],
                                           "imagePullSecrets": [{"name": registry.PULL_SECRET}]}}}}


@contextmanager
def pulling_namespace(api: Api, prefix: str) -> Iterator[str]:
    """A fresh namespace (deleted after, waiting until gone) holding the local registry's pull secret."""
    with namespace(api, prefix) as ns:
        wait(lambda: _has_default_account(api, ns), 30, f"namespace {ns} ready")
        if registry.running(Layout(ROOT)):
            api.core.create_namespaced_secret(ns, registry.pull_secret(ns, registry.password(Layout(ROOT))))
        yield ns


def _has_default_account(api: Api, ns: str) -> bool:
    try:
        api.core.read_namespaced_service_account("default", ns)
        return True
    except client.ApiException:
        return False


@dataclass
class Run:
    seconds: float
    stages: dict[str, list[float]]


def converge(api: Api, ns: str, jobs: int, workers: str, kit: str, bare: bool) -> Run:
    """Every worker Running; then the objects read once for the ledger."""
    pods = Watch(lambda **kw: api.core.list_namespaced_pod(ns, **kw), WORKER_SELECTOR).start()
    wait(pods.listed.is_set, 30, "the pod watch's first list")
    bare_client = BareClient(api) if bare else None
    started = create_jobs(api, ns, jobs, kwok=False, then=bare_client.submit if bare_client else None,
                          manifest=lambda name: job_manifest(name, workers, kit))
    if bare_client:
        bare_client.close()
    want = jobs * WORKERS
    # Every worker seen Running once: the bare client's torchrun agents find no endpoint behind its Service (it
    # writes none) and may end before the last worker starts.
    wait(lambda: len(first_running(pods, started)) >= want, 1800, f"{want} workers Running", interval=0.5)
    seconds = max(first_running(pods, started).values()) - started
    pods.stop()
    if not bare:  # the operator's Running condition comes with its batched status write, once the store serves
        try:
            wait(lambda: _all_running(api, ns, jobs), 120, "every job's Running condition", interval=1)
        except TimeoutError as exc:  # the ledger shows how far they got; the converge time stands
            print(f"  {exc}", file=sys.stderr, flush=True)
    return Run(seconds, read_ledger(api, ns))


def first_running(pods: Watch, since: float) -> dict[str, float]:
    """When the bench first saw each worker pod (by uid) Running."""
    found: dict[str, float] = {}
    for at, _, body in pods.since(since):
        if running(body):
            found.setdefault(body["metadata"]["uid"], at)
    return found


def _all_running(api: Api, ns: str, jobs: int) -> bool:
    listed = api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
    return len(listed) == jobs and all(fleet_ledger.condition(j, "Running") for j in listed)


def read_ledger(api: Api, ns: str) -> dict[str, list[float]]:
    """One list of each kind after the run: no load added while it ran."""
    serialize = api.client.sanitize_for_serialization
    jobs = api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
    pods = serialize(api.core.list_namespaced_pod(ns).items)
    slices = serialize(client.DiscoveryV1Api(api.client).list_namespaced_endpoint_slice(ns).items)
    return fleet_ledger.ledger(jobs, pods, slices, WORKERS)


def measure(api: Api, jobs: int, runs: int, workers: str, kit: str,
            operator_args: list[str]) -> tuple[list[Run], list[Run]]:
    """Alternated: operator, bare, operator, bare, ..."""
    results: dict[bool, list[Run]] = {False: [], True: []}
    for run in range(runs):
        for bare in (False, True):
            with pulling_namespace(api, "fleetp-bare" if bare else "fleetp-op") as ns:
                if bare:
                    results[bare].append(converge(api, ns, jobs, workers, kit, bare))
                else:
                    with Operator(STATE_DIR / "fleet-processes-operator.log", [*KIT_ARGS, *operator_args]):
                        results[bare].append(converge(api, ns, jobs, workers, kit, bare))
            side = "bare" if bare else "operator"
            print(f"  processes (kit {kit}) run {run + 1}: {side} {results[bare][-1].seconds:.1f}s", file=sys.stderr,
                  flush=True)
    return results[False], results[True]


def ratio_cells(operator: list[Run], bare: list[Run]) -> tuple[list[float], list[float], list[float]]:
    op, bc = [r.seconds for r in operator], [r.seconds for r in bare]
    return op, bc, [o / b for o, b in zip(op, bc)]


def print_ledger(operator: list[Run], bare: list[Run], label: str) -> None:
    print()
    print(f"Where the start goes, {label} (median of {len(operator)} runs of each run's median over its jobs):")
    for row in fleet_ledger.table([r.stages for r in operator], [r.stages for r in bare]):
        print(row)
    spread = [statistics.median(r.stages["workers running"]) for r in operator if r.stages["workers running"]]
    if spread:
        print(f"(operator's per-run median 'workers running': {', '.join(f'{s:.1f}' for s in spread)})")
