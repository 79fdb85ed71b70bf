"""Where the operator's memory goes per job: a profile of its own state, without a cluster.

The fleet bench measures the operator's resident memory at 100, 300 and 1,000 jobs on kwok; this splits it.
It builds, in this process, what the running operator keeps for each job, with the operator's own code:
the job body in the mirror (its JSON), the body of its last status write (JobMemory.written: held only until
the watch delivers that version, so most jobs hold none; counted here as if every job did), the views of its 5 pods
and its Service (from bodies shaped as the API server sends them, managedFields included), its reconcile loop
(an asyncio task waiting on its wake-up), and its store long-poll (an aiohttp request held open by a local
server that never answers, as an idle store holds it for 25 s). tracemalloc counts each part; the resident
memory before and after says what Python's allocator and the interpreter add on top.

    .venv/bin/python bench/memory.py --jobs 1000
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import sys
import tracemalloc
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from elasticjob import planner  # noqa: E402
from elasticjob.controller.context import JobMemory  # noqa: E402
from elasticjob.controller.loops import JobLoop  # noqa: E402
from elasticjob.controller.mirror import Mirror, without_managed_fields  # noqa: E402
from elasticjob.domain import JobRef  # noqa: E402
from elasticjob.models import ElasticJobSpec, ElasticJobStatus  # noqa: E402
from elasticjob.rendezvous_client import StoreClient, watch  # noqa: E402

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = {"minReplicas": 1, "maxReplicas": 4, "replicas": 4, "maxRestarts": 3,
        "template": {"spec": {"containers": [{"name": "worker", "image": "trainer:latest",
                                              "command": ["python", "/app/train.py"],
                                              "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}}}


def rss_mb() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def managed_fields(manager: str) -> list[dict]:
    """What the API server attaches to every object; the watch delivers it, the operator drops it."""
    return [{"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {f"f:{k}": {f"f:{j}": {} for j in range(12)} for k in range(8)}}]


def job_body(namespace: str, name: str) -> dict:
    uid = str(uuid.uuid4())
    body = {"apiVersion": "elasticjob.dev/v1alpha1", "kind": "ElasticJob", "spec": copy.deepcopy(SPEC),
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "12345",
                         "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": managed_fields("kubectl")}}
    ref = JobRef(namespace=namespace, name=name, uid=uid, spec=ElasticJobSpec.model_validate(SPEC))
    plan = planner.plan(planner.Job(ref=ref, generation=1, status=ElasticJobStatus()), planner.Observed([], None), NOW)
    body["status"] = plan.status.model_dump(by_alias=True, mode="json")
    return body


def pod_bodies(job: dict) -> list[dict]:
    """The pods the operator would create for this job (its own manifests), as the API server returns them."""
    meta = job["metadata"]
    ref = JobRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"],
                 spec=ElasticJobSpec.model_validate(job["spec"]))
    service = planner.Observed([], None)
    plan = planner.plan(planner.Job(ref=ref, generation=1, status=ElasticJobStatus.model_validate(job["status"])),
                        service, NOW)
    made = [a.manifest for a in plan.actions if isinstance(a, planner.CreateObject)]
    bodies = []
    for manifest in made:
        body = copy.deepcopy(manifest)
        body["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="23456",
                                creationTimestamp="2026-01-01T00:00:00Z", managedFields=managed_fields("operator"))
        if body["kind"] == "Pod":
            body["spec"]["nodeName"] = "kwok-node-1"
            body["status"] = {"phase": "Running", "podIP": "10.244.1.2", "hostIP": "10.0.0.1",
                              "startTime": "2026-01-01T00:00:01Z",
                              "conditions": [{"type": t, "status": "True"} for t in
                                             ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                              "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                                     "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}}}
                                                    for c in body["spec"]["containers"]]}
        elif body["kind"] == "Service":
            body["spec"]["clusterIP"] = "10.96.0.10"
        bodies.append(body)
    return bodies


async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.read(65536)
        await asyncio.sleep(3600)  # an idle store holds the long-poll open
    except asyncio.CancelledError:
        writer.close()


def measure(step, snapshots: list, label: str, jobs: int) -> None:
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    step()
    gc.collect()
    snapshots.append((label, (tracemalloc.get_traced_memory()[0] - before) / jobs / 1024))


async def profile(jobs: int) -> None:
    bodies = [job_body(f"team-{i % 20}", f"job-{i}") for i in range(jobs)]
    children = [pod_bodies(b) for b in bodies]
    rss_start = rss_mb()
    tracemalloc.start()
    rows: list[tuple[str, float]] = []
    mirror, memories = Mirror(), []
    # Deep copies: the watch hands over a freshly parsed body each time; what the mirror keeps of it is counted.
    measure(lambda: [mirror.jobs.apply("ADDED", copy.deepcopy(b)) for b in bodies], rows, "job body in the mirror",
            jobs)
    measure(lambda: memories.extend(JobMemory(written=without_managed_fields(copy.deepcopy(b))) for b in bodies),
            rows, "last status write's body (JobMemory.written), until the watch has it", jobs)
    measure(lambda: [mirror.pods.apply("ADDED", c) for cs in children for c in cs if c["kind"] == "Pod"],
            rows, "5 pod views", jobs)
    measure(lambda: [mirror.services.apply("ADDED", c) for cs in children for c in cs if c["kind"] == "Service"],
            rows, "Service view", jobs)
    loops: list[JobLoop] = []

    def start_loops() -> None:
        for body in bodies:
            loop = JobLoop(key=(body["metadata"]["namespace"], body["metadata"]["name"]))
            loop.task = asyncio.create_task(loop.wake.wait())
            loops.append(loop)
    measure(start_loops, rows, "reconcile loop (task waiting to be woken)", jobs)
    await asyncio.sleep(0.1)
    server = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", stdout=asyncio.subprocess.PIPE)
    port = int((await server.stdout.readline()).decode())
    client = StoreClient(b"k" * 32)
    watches: list[asyncio.Task] = []
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for body in bodies:
        watches.append(asyncio.create_task(watch(client, "127.0.0.1", port, body["metadata"]["uid"], lambda v: None)))
    await asyncio.sleep(2.0)  # every request sent and waiting
    gc.collect()
    rows.append(("store long-poll (open aiohttp request)",
                 (tracemalloc.get_traced_memory()[0] - before) / jobs / 1024))
    traced = tracemalloc.get_traced_memory()[0] / 1024 / 1024
    top = tracemalloc.take_snapshot().statistics("filename")[:6]
    tracemalloc.stop()
    grown = rss_mb() - rss_start
    print(f"per-job state of the operator, {jobs} jobs (tracemalloc, KiB per job)\n")
    print(f"{'part':<50}{'KiB/job':>10}")
    for label, kib in rows:
        print(f"{label:<50}{kib:>10.1f}")
    total = sum(kib for _, kib in rows)
    print(f"{'in all':<50}{total:>10.1f}")
    print(f"\ntraced {traced:.0f} MiB; resident memory grew {grown:.0f} MiB ({grown * 1024 / jobs:.0f} KiB per job, "
          f"tracemalloc's own bookkeeping included); at start {rss_start:.0f} MiB with the bodies built")
    print("\nlargest allocators (file):")
    for stat in top:
        print(f"  {stat.size / 1024 / 1024:7.1f} MiB  {stat.traceback[0].filename.replace(str(ROOT) + '/', '')}")
    for task in watches + [loop.task for loop in loops]:
        task.cancel()
    await asyncio.gather(*watches, *(loop.task for loop in loops), return_exceptions=True)
    await client.close()
    server.kill()
    await server.wait()


async def serve() -> None:
    """In its own process, so that its side of the connections is not counted as the operator's."""
    server = await asyncio.start_server(hang, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(serve() if args.serve else profile(args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
