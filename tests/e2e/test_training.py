"""Real torchrun training under the operator, with faults injected while it runs.

Every scenario asserts on what training did (progress.jsonl written by examples/train_ddp.py), not only on the
job's status. Core scenarios (start, rank-0 pod killed, failing script) run in `make test`; the others are
marked slow and run in `make e2e`. Recovery times (fault -> next completed step) are printed at the end.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from e2e_support import Jobs, Progress, exit_codes, job_manifest, process, spread_workers, summary, train_args
from helpers import wait_for

START_TIMEOUT = 90  # pods scheduled, rendezvous formed, `import torch` in every process, on 2 cores
RECOVERY_TIMEOUT = 90
# A lost node's pods: NotReady after 20 s, evicted after 30 s of toleration, force-deleted 15 s past their grace.
EVICTION = 75
STORE_POD = "train-rdzv"
FINISH_TIMEOUT = 120
CHECKPOINT_EVERY = 5


def wait_progress(progress, until, timeout: float, what: str) -> Progress:
    return wait_for(progress, timeout, what, until=until)


def start(jobs: Jobs, progress, manifest: dict, *, world_size: int, min_step: int = 1) -> Progress:
    jobs.create(manifest)
    return wait_progress(
        progress, lambda p: any(r["world_size"] == world_size and r["step"] >= min_step for r in p.records),
        START_TIMEOUT, f"a completed step >= {min_step} at world size {world_size}")


def finish(jobs: Jobs, progress, steps: int) -> Progress:
    """The job succeeded and training really reached its last step, every step done at least once."""
    status = jobs.wait_phase("Succeeded", FINISH_TIMEOUT)
    pods = jobs.worker_pods()
    still_running = [p.metadata.name for p in jobs.live_workers()]
    assert not still_running, f"job Succeeded while workers still run: {still_running}; {status}"
    assert 0 in exit_codes(pods).values(), f"no worker pod exited 0: {jobs.pods_summary()}"
    done = progress()
    missing = set(range(1, steps + 1)) - {r["step"] for r in done.records}
    assert done.last_step == steps and not missing, f"training incomplete (steps never done: {sorted(missing)}): {done}"
    return done


def recovery(progress, fault_time: float, what: str, world_size: int | None = None) -> dict:
    return wait_progress(progress, lambda p: p.first_after(fault_time, world_size), RECOVERY_TIMEOUT,
                         f"a completed step after {what}").first_after(fault_time, world_size)


def assert_resumed_from_checkpoint(before: Progress, resumed: dict) -> None:
    """Restarted workers lose at most the steps since the last checkpoint."""
    assert resumed["resumed_from"] >= before.last_step - CHECKPOINT_EVERY, (
        f"restarted from step {resumed['resumed_from']}, but step {before.last_step} had been reached "
        f"with a checkpoint every {CHECKPOINT_EVERY} steps")


# ---------------------------------------------------------------- core


def test_start_runs_to_success(operator, jobs, progress):
    steps = 12
    start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps)), world_size=2)
    status = jobs.wait_phase("Succeeded", FINISH_TIMEOUT)
    pods = jobs.worker_pods()
    assert exit_codes(pods) == {"train-worker-0": 0, "train-worker-1": 0}, jobs.pods_summary()
    finished_at = max(p.status.container_statuses[0].state.terminated.finished_at for p in pods)
    assert status["completionTime"] >= finished_at.strftime("%Y-%m-%dT%H:%M:%SZ"), (
        f"Succeeded at {status['completionTime']} before the last worker exited at {finished_at}")
    done = finish(jobs, progress, steps)
    last = [r for r in done.records if r["step"] == steps]
    assert {(r["rank"], r["world_size"]) for r in last} == {(0, 2), (1, 2)}, last


@pytest.mark.slow
def test_the_kit_in_the_image_trains_warm_without_init_containers(operator, jobs, progress):
    """spec.kit: Image (issue 37): the project's worker image carries the kit, so no pod of the job gets the kit's
    init container; the store and warm torchrun run from the image."""
    steps = 8
    start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps), kit="Image"), world_size=2)
    pods = jobs.core.list_namespaced_pod(jobs.namespace, label_selector="elasticjob.dev/job-name").items
    assert {p.metadata.name for p in pods} >= {STORE_POD, "train-worker-0", "train-worker-1"}, jobs.pods_summary()
    with_init = [p.metadata.name for p in pods if p.spec.init_containers]
    assert not with_init, f"pods with an init container: {with_init}"
    warm_starts = next(c for c in jobs.status()["conditions"] if c["type"] == "WarmStarts")
    assert (warm_starts["status"], warm_starts["reason"]) == ("True", "KitInImage"), warm_starts
    logs = [jobs.core.read_namespaced_pod_log(p.metadata.name, jobs.namespace) for p in jobs.worker_pods()]
    assert all("rendezvous polled every 0.1 s" in log for log in logs), "not run by the image's elasticjob_warm"
    finish(jobs, progress, steps)


# cold in make e2e only: warm starts are the default; the cold start also runs in the unit tier's real agents.
@pytest.mark.parametrize("warm", [pytest.param(False, marks=pytest.mark.slow), True], ids=["cold", "warm"])
def test_sigkill_of_the_rank0_pod_keeps_training(operator, jobs, progress, faults, record_recovery, warm):
    steps = 40
    before = start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps), warm_starts=warm),
                   world_size=2, min_step=CHECKPOINT_EVERY + 2)
    victim = before.rank0_host()
    fault_time = faults.kill_pod(victim)
    before = Progress([r for r in progress().records if r["time"] <= fault_time])
    resumed = recovery(progress, fault_time, f"SIGKILL of {victim}")
    assert_resumed_from_checkpoint(before, resumed)
    finish(jobs, progress, steps)
    restarts = jobs.status().get("restarts")
    assert restarts == 1, f"one killed pod must count as exactly one restart: {jobs.status()}"
    assert (jobs.status()["rendezvous"].get("round") or 0) >= 1, f"the group re-formed: {jobs.status()}"
    logs = {p.metadata.name: jobs.core.read_namespaced_pod_log(p.metadata.name, jobs.namespace)
            for p in jobs.worker_pods()}
    warm_starts = next(c for c in jobs.status()["conditions"] if c["type"] == "WarmStarts")
    if warm:  # plain torchrun in the command: every worker came from its pod's warm server, through the kit
        assert warm_starts["status"] == "True", warm_starts
        cold = [name for name, log in logs.items() if "no warm worker" in log or "plain torchrun" in log]
        assert not cold, f"workers started cold in {cold}"
        assert all("rendezvous polled every 0.1 s" in log for log in logs.values()), "not run by elasticjob_warm"
    else:
        assert (warm_starts["status"], warm_starts["reason"]) == ("False", "Disabled"), warm_starts
        assert not any("rendezvous polled every 0.1 s" in log for log in logs.values())
    record_recovery(f"SIGKILL rank-0 pod {victim}{' (warm)' if warm else ''}", resumed["time"] - fault_time,
                    resumed["world_size"], restarts)


def test_a_warm_spare_takes_the_place_of_a_deleted_rank0_pod(operator, jobs, progress, record_recovery):
    """spec.spares: 1 (issue 53): three pods, two seats. The spare waits warm and trains nothing; rank 0's pod
    deleted, the spare joins the next round, so training goes on at its full size of 2 with no round at 1 between,
    and the deleted pod's replacement becomes the next spare."""
    steps = 60
    before = start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps), spares=1),
                   world_size=2, min_step=CHECKPOINT_EVERY + 2)
    wait_for(jobs.status, START_TIMEOUT, "a spare ready", until=lambda s: s.get("spares") == 1)
    assert len(jobs.live_workers()) == 3, jobs.pods_summary()
    hosts = {r["host"] for r in progress().records}
    assert len(hosts) == 2, f"the spare trained: steps came from {hosts}"
    victim = before.rank0_host()
    fault_time = time.time()
    jobs.core.delete_namespaced_pod(victim, jobs.namespace, grace_period_seconds=0)
    resumed = recovery(progress, fault_time, f"deletion of {victim}", world_size=2)
    smaller = [r for r in progress().after(fault_time) if r["world_size"] != 2]
    assert not smaller, f"a round formed below the job's size: {smaller[:3]}"
    wait_for(jobs.status, START_TIMEOUT, "the replacement ready as the next spare",
             until=lambda s: s.get("spares") == 1 and s.get("readyReplicas") == 2)
    finish(jobs, progress, steps)
    record_recovery(f"rank-0 pod {victim} deleted, a warm spare ready", resumed["time"] - fault_time,
                    resumed["world_size"], jobs.status().get("restarts"))


def test_trains_under_the_charts_least_privilege_rbac(cluster, operator_factory, install_rbac, kube, jobs,
                                                     progress, tmp_path):
    """The basic scenario with the operator acting as the chart's ServiceAccount (token from TokenRequest)."""
    from pathlib import Path

    from chart_rbac import service_account_kubeconfig

    user = install_rbac({"watch": {"allNamespaces": False, "namespaces": [jobs.namespace]}}, jobs.namespace)
    kubeconfig = service_account_kubeconfig(kube, Path(cluster.kubeconfig), jobs.namespace, user.rsplit(":", 1)[1],
                                            tmp_path / "operator.kubeconfig")
    operator = operator_factory(namespaces=[jobs.namespace], env={"KUBECONFIG": str(kubeconfig)})
    steps = 8
    start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps)), world_size=2)
    finish(jobs, progress, steps)
    denied = [line for line in operator.log_text().splitlines() if "orbidden" in line or " 403" in line]
    assert not denied, "the chart's RBAC refused the operator:\n" + "\n".join(denied[:5])


def test_always_failing_script_exhausts_max_restarts(operator, jobs, progress):
    manifest = job_manifest(jobs.namespace, max_restarts=1, train_args=train_args(10, extra=("--fail-exit-code", 3)))
    jobs.create(manifest)
    status = jobs.wait_phase("Failed", FINISH_TIMEOUT)
    assert status.get("reason") == "MaxRestartsExceeded", status
    assert "exit code 3" in status.get("message", ""), status
    assert 3 in {f.get("exitCode") for f in status.get("lastFailures", [])}, status
    assert len(progress()) == 0, "a step completed although every run exits at its first step"


def test_fatal_exit_code_fails_the_job(operator, jobs, progress):
    manifest = job_manifest(jobs.namespace, max_restarts=1, failurePolicy={"fatalExitCodes": [3]},
                            train_args=train_args(10, extra=("--fail-exit-code", 3)))
    jobs.create(manifest)
    status = jobs.wait_phase("Failed", FINISH_TIMEOUT)
    assert status.get("reason") == "FatalExitCode", status
    assert "3" in status.get("message", ""), status
    assert len(progress()) == 0


def test_scale_downs_cost_nothing_and_lose_no_step(operator, jobs, progress, record_recovery):
    """torchrun spends its restart budget when a peer leaves; with maxRestarts 1 two scale-downs used to
    fail the job. Membership changes are never charged, and no step is lost: the smaller world resumes from the
    last step any rank completed (saved at a planned stop, or on SIGTERM where none could be asked)."""
    steps = 70
    manifest = job_manifest(jobs.namespace, replicas=3, max_restarts=1, train_args=train_args(steps))
    start(jobs, progress, manifest, world_size=3, min_step=3)
    for world in (2, 1):
        scaled_at = time.time()
        jobs.scale(world)
        shrunk = recovery(progress, scaled_at, f"scaling to {world}", world_size=world)
        # A scale right after a restart may reach a rank before its first step: then it has nothing to save.
        done = max(r["step"] for r in progress().records if r["time"] < shrunk["time"])
        assert shrunk["resumed_from"] == done, (
            f"resumed from {shrunk['resumed_from']} after step {done} was done: steps lost "
            f"(saved since the scale: {[e for e in progress.events() if e['time'] >= scaled_at]})")
        record_recovery(f"scale {world + 1} -> {world}", shrunk["time"] - scaled_at, world,
                        jobs.status().get("restarts"))
    done = finish(jobs, progress, steps)
    assert {r["world_size"] for r in done.records} == {3, 2, 1}
    status = jobs.status()
    assert (status.get("restarts"), status.get("infrastructureFailures")) == (0, 0), (
        f"a scale-down is no failure: {summary(status)}")
    assert not status.get("lastFailures"), status.get("lastFailures")


# ---------------------------------------------------------------- slow


@pytest.mark.slow
def test_scale_up_through_the_scale_subresource(operator, jobs, progress, record_recovery):
    steps = 80
    start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps)), world_size=2, min_step=3)
    scaled_at = time.time()
    jobs.scale(3)
    grown = recovery(progress, scaled_at, "scaling to 3", world_size=3)
    finish(jobs, progress, steps)
    assert jobs.status().get("restarts") == 0, f"a join is no failure: {jobs.status()}"
    record_recovery("scale 2 -> 3", grown["time"] - scaled_at, 3, jobs.status().get("restarts"))


def test_rendezvous_pod_killed_costs_no_worker_pod_and_no_restart(operator, jobs, progress, faults, record_recovery):
    """The agents ride out the store's restart (elasticjob_warm/outage.py, through the operator's kit) and write the
    round they run back into the new store (resume.py): every worker process trains on through it, no pod is
    replaced, nothing is charged, and the job's ledger books the loss at 0 s."""
    steps = 80
    start(jobs, progress, job_manifest(jobs.namespace, train_args=train_args(steps)), world_size=2,
          min_step=CHECKPOINT_EVERY + 2)
    workers = {p.metadata.name: p.metadata.uid for p in jobs.worker_pods()}
    fault_time = faults.kill_pod(STORE_POD)
    try:
        wait_for(lambda: resumed_agents(jobs, workers), RECOVERY_TIMEOUT,
                 "both agents to resume their round on the store that came back",
                 until=lambda found: len(found) == len(workers))
    except AssertionError as error:
        raise AssertionError(f"{error}\n{rejoin_story(jobs)}") from None
    done = finish(jobs, progress, steps)
    before = {process(r) for r in done.records if r["time"] <= fault_time}
    assert {process(r) for r in done.records} == before, f"a worker process was restarted:\n{rejoin_story(jobs)}"
    status = jobs.status()
    assert not status.get("lastFailures"), (f"a worker pod failed with the store: {status.get('lastFailures')}\n"
                                            f"{rejoin_story(jobs)}")
    assert {p.metadata.name: p.metadata.uid for p in jobs.worker_pods()} == workers, "a worker pod was replaced"
    assert status["rendezvous"]["restarts"] >= 1 and status.get("restarts") == 0, status
    # Before the fault, at most the job's start: the second agent joining a round the first formed alone.
    incidents = status["goodput"].get("lastIncidents", [])
    booked = [(i["kind"], i.get("lostSeconds")) for i in incidents if started(i) >= fault_time]
    earlier = [(i["kind"], i["reason"]) for i in incidents if started(i) < fault_time]
    story = f"{ledger_story(jobs, status)}\n{rejoin_story(jobs)}"
    assert booked == [("StoreLost", 0.0)], f"{booked}\n{story}"
    assert set(earlier) <= {("Rejoin", "AgentJoined")}, f"{earlier}\n{story}"
    record_recovery("SIGKILL rendezvous pod (longest pause in steps)", longest_pause(done, fault_time), 2,
                    status.get("restarts"))


def resumed_agents(jobs: Jobs, pods) -> list[str]:
    return [name for name in pods
            if "resumed on it, the workers train on" in jobs.core.read_namespaced_pod_log(name, jobs.namespace)]


def longest_pause(done: Progress, since: float) -> float:
    """The longest time between two steps of rank 0 from the step before `since` on."""
    times = sorted(r["time"] for r in done.records if r["rank"] == 0)
    later = [t for t in times if t > since]
    start_at = max((t for t in times if t <= since), default=since)
    marks = [start_at, *later]
    return max((b - a for a, b in zip(marks, marks[1:])), default=0.0)


def started(incident: dict) -> float:
    return datetime.fromisoformat(incident["startTime"].replace("Z", "+00:00")).timestamp()


def ledger_story(jobs: Jobs, status: dict) -> str:
    """The ledger's incidents in full and the job's Events, oldest first, for a failure's message: which round or
    report opened each incident, and when."""
    def when(event) -> str:  # an Event may carry only one of its three times; none should not hide the failure
        return str(event.event_time or event.last_timestamp or event.first_timestamp or "")

    events = sorted(jobs.core.list_namespaced_event(jobs.namespace).items, key=when)
    goodput = status["goodput"]
    lines = [f"incident: {incident}" for incident in goodput.get("lastIncidents", [])]
    lines += [f"open: {goodput.get('openIncident')}", f"queued: {goodput.get('queuedIncidents')}"]
    lines += [f"rendezvous: {status.get('rendezvous')}"]
    lines += [f"event {when(e)} {e.involved_object.name} {e.reason}: {e.message}"
              for e in events if e.involved_object.kind == "ElasticJob"]
    return "\n".join(lines)


def rejoin_story(jobs: Jobs) -> str:
    """The store's rounds and the agents' rejoins, for a failure's message."""
    lines = []
    for pod in [STORE_POD, *(p.metadata.name for p in jobs.worker_pods())]:
        log = jobs.core.read_namespaced_pod_log(pod, jobs.namespace, timestamps=True)
        lines += [f"{pod}: {line}" for line in log.splitlines()
                  if any(word in line for word in ("formed", "answers again", "stopped answering", "waiter",
                                                   "resumed", "restart", "FAILED", "failed with"))]
    return "\n".join(sorted(lines, key=lambda line: line.split(": ", 1)[1]))


@pytest.mark.slow
@pytest.mark.host_operator
def test_node_loss(cluster, local_cluster, operator, jobs, progress, faults, record_recovery):
    # Training must outlast the node's eviction, about 55 s after the fault (20 s to NotReady, 30 s of
    # toleration): with warm recovery 100 steps of 0.25 s ended before it, and nothing was lost to count.
    steps = 320
    manifest = spread_workers(job_manifest(jobs.namespace, train_args=train_args(steps)))
    before = start(jobs, progress, manifest, world_size=2, min_step=CHECKPOINT_EVERY + 2)
    node = jobs.pod(before.rank0_host()).spec.node_name
    if node == jobs.pod(STORE_POD).spec.node_name:
        # The store there too is test_node_loss_with_the_store's case, slower by the eviction: the other worker's.
        node = next(p.spec.node_name for p in jobs.worker_pods() if p.spec.node_name != node)
    fault_time = faults.lose_node(node)
    try:
        resumed = recovery(progress, fault_time, f"node {node} was lost", world_size=1)
        done = finish(jobs, progress, steps)
    finally:
        faults.restore_node(node)
    status = jobs.status()
    # The lost pod counts once, as an infrastructure failure, however often the operator saw it terminating.
    assert (status.get("restarts"), status.get("infrastructureFailures")) == (0, 1), summary(status)
    assert [f["reason"] for f in status.get("lastFailures", [])] == ["NodeLost"], status.get("lastFailures")
    assert 2 in {r["world_size"] for r in done.records if r["time"] > resumed["time"]}, (
        "the replacement, on a healthy node, joined the survivor")
    record_recovery(f"node loss ({node})", resumed["time"] - fault_time, resumed["world_size"],
                    status.get("restarts"))


@pytest.mark.slow
@pytest.mark.host_operator
def test_node_loss_with_the_store(cluster, local_cluster, operator, jobs, progress, faults, record_recovery):
    """The store and a worker on the node lost. The survivor's workers wait in a collective for the lost peer, and
    no new round forms until a store serves again; the operator makes none while the lost node's store may still
    serve whoever it can reach (two stores are two worlds), so the new store comes once the node's pods are
    evicted, about 75 s after the loss. The survivor's agent waits for it (elasticjob_warm/outage.py) and joins
    its round with the lost worker's replacement: nothing charged, no pod but the lost ones replaced."""
    from localcluster.faults import cordon

    steps = 60  # no step is made while the store is gone: the survivor waits for its lost peer
    free = [n.metadata.name for n in jobs.core.list_node().items if not n.spec.unschedulable][2:]
    for name in free:  # two nodes for the store and both workers: the store shares one with a worker
        cordon(jobs.core, name)
    try:
        manifest = spread_workers(job_manifest(jobs.namespace, train_args=train_args(steps)))
        start(jobs, progress, manifest, world_size=2, min_step=CHECKPOINT_EVERY + 2)
    finally:
        for name in free:  # room again for what replaces the lost node's pods
            cordon(jobs.core, name, False)
    node = jobs.pod(STORE_POD).spec.node_name
    fault_time = faults.lose_node(node)
    try:
        try:
            resumed = wait_progress(progress, lambda p: p.first_after(fault_time), EVICTION + RECOVERY_TIMEOUT,
                                    f"a step after node {node} was lost with the store").first_after(fault_time)
        except AssertionError as failure:
            status = jobs.status()
            logs = {pod.metadata.name: jobs.core.read_namespaced_pod_log(
                pod.metadata.name, jobs.namespace, tail_lines=25) for pod in jobs.worker_pods()}
            raise AssertionError(f"{failure}; the job: {summary(status)}, its rendezvous: {status.get('rendezvous')}, "
                                 f"its workers: {jobs.pods_summary()}, their logs: {logs}") from None
        finish(jobs, progress, steps)
    finally:
        faults.restore_node(node)
    status = jobs.status()
    assert (status.get("restarts"), status.get("infrastructureFailures")) == (0, 1), summary(status)
    assert [f["reason"] for f in status.get("lastFailures", [])] == ["NodeLost"], status.get("lastFailures")
    assert status["rendezvous"]["restarts"] == 1, status["rendezvous"]
    record_recovery(f"node loss with the store ({node})", resumed["time"] - fault_time, resumed["world_size"],
                    status.get("restarts"))


@pytest.mark.slow
def test_hung_worker_is_restarted_by_the_watchdog(operator, jobs, progress, record_recovery):
    steps, hang_at, step_timeout = 24, 8, 5
    manifest = job_manifest(jobs.namespace, watchdog={"enabled": True, "stepTimeoutSeconds": step_timeout},
                            train_args=train_args(steps, extra=("--hang-at-step", hang_at)))
    start(jobs, progress, manifest, world_size=2)
    # A join restarts workers without counting; only a failure (the watchdog's kill) raises the restart count.
    restarted = wait_progress(progress, lambda p: [r for r in p.records if r["restart_count"] >= 1],
                              START_TIMEOUT + RECOVERY_TIMEOUT, f"a step by workers restarted after the hang at {hang_at}")
    resumed = min((r for r in restarted.records if r["restart_count"] >= 1), key=lambda r: r["time"])
    hang_began = max(r["time"] for r in restarted.records if r["step"] == hang_at - 1 and r["time"] < resumed["time"])
    assert not [r for r in restarted.records if r["step"] >= hang_at and r["time"] < resumed["time"]], (
        f"step {hang_at} completed before the restart: rank 0 did not hang")
    assert resumed["time"] - hang_began >= step_timeout, f"the group restarted before the step deadline: {resumed}"
    finish(jobs, progress, steps)
    record_recovery(f"rank 0 hung (timeout {step_timeout}s)", resumed["time"] - hang_began, resumed["world_size"],
                    jobs.status().get("restarts"))
