"""A job under the real Kueue (the local cluster's add-on, v0.19.2, ElasticJobsViaWorkloadSlices on by default)
grows and shrinks through workload slices: scaled 2 -> 4 in a queue with room for 3 it asks for a slice and runs
its 2 admitted workers; once quota frees Kueue admits the slice, marks the old one Finished, and the job runs 4;
scaled down, its Workload shrinks in place and the quota is released. All along, the pods that hold resources never
ask for more than the ClusterQueue has.

Cheap workers (sleep); the operator with its defaults (--kueue, slices on).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from jobapi import GROUP, PLURAL, VERSION, create, job_manifest, pods, status_of, wait_phase

from helpers import wait_for
from kueue_support import Queues, QuotaWatch, conditions, kueue, queued, queues  # noqa: F401 (fixtures)

WORKER = {"requests": {"cpu": "400m", "memory": "64Mi"}}
QUOTA = "1800m"  # 2 workers and a store (0.9) beside the blocker (0.5) leaves room for 3 workers, not 4
SLEEP = ["python", "-c", "import time; time.sleep(3600)"]


@pytest.fixture
def operator(operator_factory):
    return operator_factory(extra_args=["--kueue"])


@pytest.fixture
def quota_watch(api, namespace) -> Iterator[QuotaWatch]:
    with QuotaWatch(api[1], namespace, QUOTA) as watch:
        yield watch


def scale(api, namespace, name, replicas) -> None:
    api[0].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}})


def workloads(queues: Queues) -> list[dict]:
    found = queues.custom.list_namespaced_custom_object(GROUP_KUEUE, "v1beta2", queues.namespace, "workloads")
    return sorted(found["items"], key=lambda w: w["metadata"]["creationTimestamp"])


GROUP_KUEUE = "kueue.x-k8s.io"


def running_workers(api, namespace, job, count):
    return wait_for(lambda: [p for p in pods(api, namespace) if p.metadata.name.startswith(f"{job}-")
                             and p.status.phase == "Running"], 90, f"{count} running workers of {job}",
                    until=lambda ps: len(ps) == count)


def test_a_job_grows_through_a_workload_slice_once_kueue_admits_it_and_shrinks_in_place(
        api, namespace, operator, queues: Queues, quota_watch: QuotaWatch):
    queues.make(cpu=QUOTA)
    priority = queues.priority("grow", 500)  # the slice carries it too, or Kueue would order it as priority 0
    # The same for the blocker: a slice of higher priority would preempt it rather than wait.
    create(api, namespace, queued(job_manifest("blocker", SLEEP, minReplicas=1, maxReplicas=1, replicas=1,
                                               resources=WORKER), priority=priority))
    wait_phase(api, namespace, "blocker", "Running", timeout=90)
    create(api, namespace, queued(job_manifest("grow", SLEEP, minReplicas=1, maxReplicas=4, replicas=2,
                                               resources=WORKER), priority=priority))
    wait_phase(api, namespace, "grow", "Running", timeout=90)
    first = running_workers(api, namespace, "grow", 2)
    first_workload = status_of(api, namespace, "grow")["admission"]["workload"]

    # 2 -> 4 with room for 3: a slice is asked for and waits; the two admitted workers run on, untouched.
    scale(api, namespace, "grow", 4)
    slice_name = f"{first_workload}-s1"
    waiting = wait_for(lambda: status_of(api, namespace, "grow"), 60, "the job to say its slice waits",
                       until=lambda s: "insufficient unused quota" in ((s.get("admission") or {}).get("message") or ""))
    assert waiting["admission"]["requested"] == 4 and waiting["admission"]["workers"] == 2, waiting
    assert slice_name in waiting["message"] and waiting["phase"] == "Running", waiting
    made = queues.workload(slice_name)
    annotations = made["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/workload-slice-replacement-for"] == f"{namespace}/{first_workload}"
    assert annotations["kueue.x-k8s.io/elastic-job"] == "true"
    assert [(p["name"], p["count"]) for p in made["spec"]["podSets"]] == [("workers", 4), ("store", 1)]
    assert (made["spec"].get("priorityClassRef", {}).get("name"), made["spec"].get("priority")) == (priority, 500)
    assert {p.metadata.uid for p in running_workers(api, namespace, "grow", 2)} == {p.metadata.uid for p in first}

    # The blocker goes: Kueue admits the slice (charged the difference), finishes the old one; the job runs 4.
    api[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "blocker")
    grown = running_workers(api, namespace, "grow", 4)
    assert {p.metadata.uid for p in first} <= {p.metadata.uid for p in grown}  # the running pods are kept
    old = wait_for(lambda: queues.workload(first_workload), 30, "the old slice Finished",
                   until=lambda w: conditions(w).get("Finished", {}).get("status") == "True")
    assert conditions(old)["Finished"]["reason"] == "WorkloadSliceReplaced"
    status = status_of(api, namespace, "grow")
    assert (status["admission"]["workload"], status["admission"]["workers"]) == (slice_name, 4), status
    assert not status["admission"].get("requested") and status.get("restarts", 0) == 0

    # 4 -> 2: the admitted slice shrinks in place and Kueue releases the rest.
    scale(api, namespace, "grow", 2)
    running_workers(api, namespace, "grow", 2)
    shrunk = wait_for(lambda: queues.workload(slice_name), 30, "the slice shrunk in place",
                      until=lambda w: w["spec"]["podSets"][0]["count"] == 2)
    assert conditions(shrunk)["Admitted"]["status"] == "True"
    assert [w["metadata"]["name"] for w in workloads(queues)
            if conditions(w).get("Finished", {}).get("status") != "True"] == [slice_name]
    create(api, namespace, queued(job_manifest("after", SLEEP, minReplicas=2, maxReplicas=2, replicas=2,
                                               resources=WORKER)))
    wait_phase(api, namespace, "after", "Running", timeout=90)  # fits only in the quota the shrink gave back

    quota_watch.stop()
    assert quota_watch.samples > 10 and quota_watch.worst <= quota_watch.quota, quota_watch.worst


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_an_operator_killed_as_it_asks_for_a_slice_leaves_one_slice_and_the_world_alone(
        api, namespace, operator_factory, queues: Queues, delay):
    """SIGKILL while the scale-up is planned or the slice is being created: the next operator finds the slice (or
    makes it), asks for it once, and leaves the running pods alone; scaled back, the slice Kueue never admitted
    is deleted and the first Workload alone holds quota."""
    import signal
    import time as clock

    queues.make(cpu="1")  # 2 workers and the store: room for nothing more
    first = operator_factory(extra_args=["--kueue"])
    create(api, namespace, queued(job_manifest("grow", SLEEP, minReplicas=1, maxReplicas=4, replicas=2,
                                               resources=WORKER)))
    wait_phase(api, namespace, "grow", "Running", timeout=90)
    before = {p.metadata.uid for p in running_workers(api, namespace, "grow", 2)}
    scale(api, namespace, "grow", 4)
    started = clock.monotonic()
    wait_for(lambda: clock.monotonic() - started, 5, f"{delay}s into the scale-up", until=lambda t: t >= delay)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    first.check_log, first.exit_code = False, 0
    operator_factory(extra_args=["--kueue"]).wait_for_log("watches synced", timeout=60)
    # The status is written before the slice is made (and the first operator may have died between the two): the
    # slice is there once a reconcile has seen it waiting, and no later one makes another.
    wait_for(lambda: status_of(api, namespace, "grow").get("admission") or {}, 60, "the slice seen waiting",
             until=lambda a: a.get("requested") == 4 and "not admitted" in (a.get("message") or ""))
    live = [w for w in workloads(queues) if conditions(w).get("Finished", {}).get("status") != "True"]
    assert len(live) == 2 and sum(1 for w in live if "kueue.x-k8s.io/workload-slice-replacement-for"
                                  in (w["metadata"].get("annotations") or {})) == 1, live
    assert {p.metadata.uid for p in running_workers(api, namespace, "grow", 2)} == before

    scale(api, namespace, "grow", 2)
    left = wait_for(lambda: workloads(queues), 30, "the unadmitted slice deleted", until=lambda ws: len(ws) == 1)
    assert conditions(left[0])["Admitted"]["status"] == "True"
    assert not (status_of(api, namespace, "grow").get("admission") or {}).get("requested")


def test_a_job_preempted_after_growing_through_a_slice_is_requeued_with_partial_admission(
        api, namespace, operator, queues: Queues):
    """Grown 1 -> 3 through a slice, then preempted: its slice is admitted whole or waits, so the operator deletes
    it once the quota is released and asks again as a first Workload does, down to minReplicas; the job runs
    what fits beside the preemptor (2 workers), not nothing until it goes. It once waited for good."""
    queues.make(cpu=QUOTA)  # 1800m: the grown job (3 x 400m and the store) and a 2-worker preemptor do not fit
    low, high = queues.priority("low", 10), queues.priority("high", 1000)
    create(api, namespace, queued(job_manifest("grow", SLEEP, minReplicas=1, maxReplicas=3, replicas=1,
                                               resources=WORKER), priority=low))
    wait_phase(api, namespace, "grow", "Running", timeout=90)
    first_workload = status_of(api, namespace, "grow")["admission"]["workload"]
    scale(api, namespace, "grow", 3)
    running_workers(api, namespace, "grow", 3)
    slice_name = wait_for(lambda: status_of(api, namespace, "grow")["admission"], 60, "the slice admitted",
                          until=lambda a: a.get("workers") == 3)["workload"]
    assert slice_name == f"{first_workload}-s1"

    create(api, namespace, queued(job_manifest("high", SLEEP, minReplicas=2, maxReplicas=2, replicas=2,
                                               resources=WORKER), priority=high))
    wait_phase(api, namespace, "high", "Running", timeout=90)
    # Requeued: a new Workload (not the first's name, which its Finished Workload holds), partial admission.
    running_workers(api, namespace, "grow", 2)
    status = wait_for(lambda: status_of(api, namespace, "grow"), 60, "the job running again beside the preemptor",
                      until=lambda s: s.get("phase") == "Running" and (s.get("admission") or {}).get("workers") == 2)
    again = queues.workload(status["admission"]["workload"])
    assert again["metadata"]["name"] != first_workload
    assert "kueue.x-k8s.io/workload-slice-replacement-for" not in (again["metadata"].get("annotations") or {})
    assert [(p["name"], p["count"], p.get("minCount")) for p in again["spec"]["podSets"]][0] == ("workers", 3, 1)
    reasons = [e.reason for e in api[1].list_namespaced_event(namespace).items
               if e.involved_object.name == "grow"]
    assert "Requeued" in reasons and "QuotaReleased" in reasons, reasons
    assert status.get("restarts", 0) == 0
