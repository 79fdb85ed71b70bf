"""`make run`'s story: an elastic job grows, loses the pod that holds rank 0, loses its rendezvous store, and
finishes; then a table of what each of those cost.

Each fault is timed as bench/recovery.py and the e2e tests time it: from the fault to the first training step
completed by a worker process that had written nothing before it (a survivor may still finish the step it was
in); the store's loss, which the workers train on through, as the longest pause in the steps until a new store
serves. Whether it was charged to maxRestarts comes from status.restarts and status.lastFailures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml
from kubernetes import client
from rich import box
from rich.table import Table

from . import faults, liveview
from .liveview import Snapshot, View

POLL = 0.5
START_TIMEOUT = 120
RECOVERY_TIMEOUT = 90
FINISH_TIMEOUT = 120
STEPS_BETWEEN = 3  # training steps to let pass after a recovery before the next fault
AFTER_BACK = 3.0  # seconds of training looked at after a lost store is back
FINISHED = ("Succeeded", "Failed")


@dataclass
class Fault:
    what: str
    at: float
    pod_uid: str | None = None  # the pod it killed: failures on record for that pod are this fault's
    owns: tuple[str, ...] = ()  # failure reasons only this fault causes (RendezvousLost for the store)
    seconds: float | None = None  # fault -> next completed step; None: never within RECOVERY_TIMEOUT
    world_size: int | None = None
    charged: int | None = None  # failures charged to maxRestarts for it (None until known)
    reasons: tuple[str, ...] = ()  # lastFailures recorded for it
    note: str = ""  # how the training went through it, where the seconds are not a new process's first step


class Story:
    def __init__(self, api: client.ApiClient, kubeconfig: Path, manifest: Path, job: dict, view: View,
                 state_dir: Path):
        self.api, self.kubeconfig, self.view, self.state_dir = api, kubeconfig, view, state_dir
        self.manifest, self.job = manifest, job
        self.name, self.namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
        self.progress = Path(job["spec"]["checkpointDir"]) / "progress.jsonl"  # a hostPath at the same path
        self.faults: list[Fault] = []
        self.snap: Snapshot | None = None

    # --- watching ---------------------------------------------------------------------------------------
    def observe(self) -> Snapshot:
        self.snap = liveview.observe(self.api, self.namespace, self.name, self.progress)
        self.view.update(self.snap)
        return self.snap

    def wait(self, until: Callable[[Snapshot], object], timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            snap = self.observe()
            if found := until(snap):
                return found
            if snap.phase in ("Succeeded", "Failed") and what != "the job to finish":
                raise StoryError(f"the job finished {snap.phase} while waiting for {what}: "
                                 f"{snap.status.get('message')}")
            if time.monotonic() >= deadline:
                raise StoryError(f"timed out after {timeout:.0f}s waiting for {what}; "
                                 f"last seen: {liveview.plain_line(snap)}")
            time.sleep(POLL)

    # --- acts -------------------------------------------------------------------------------------------
    def run(self) -> str:
        self.view.say(f"$ kubectl apply -f {self.manifest.parent.name}/{self.manifest.name}     "
                      f"# {self.name}: 1 to 3 nodes, starting with 2 (its image the local registry's)")
        # The job as demo.py adapted it (its worker image pushed to the local registry): the file's own image
        # names no registry, and no node has it under that name.
        applied = self.state_dir / self.manifest.name
        applied.write_text(yaml.safe_dump(self.job))
        self.kubectl("apply", "-f", str(applied))
        self.wait(lambda s: s.world_size == 2 and s.step >= STEPS_BETWEEN, START_TIMEOUT, "training at world size 2")
        self.scale_up()
        self.steps_pass()
        self.kill_rank0()
        self.steps_pass()
        self.kill_store()
        self.view.say("now let it finish")
        snap = self.wait(lambda s: s if s.phase in ("Succeeded", "Failed") else None, FINISH_TIMEOUT,
                         "the job to finish")
        self.settle(snap)
        return snap.phase

    def scale_up(self) -> None:
        self.view.say(f"$ kubectl scale elasticjob/{self.name} --replicas=3     # grow while it trains")
        fault = self.begin("scale 2 -> 3 (kubectl scale)")
        self.kubectl("scale", f"elasticjob/{self.name}", "--replicas=3")
        self.recovered(fault, world_size=3)

    def kill_rank0(self) -> None:
        rank0 = [r for r in self.snap.records if r["rank"] == 0][-1]["host"]  # hostname = pod name
        self.view.say(f"$ python -m localcluster.faults kill-pod {self.namespace}/{rank0}     "
                      f"# SIGKILL the pod that holds rank 0 (progress.jsonl says so)")
        fault = self.begin(f"SIGKILL the rank-0 pod ({rank0})", pod_uid=self.uid_of(rank0))
        self.signal_pod(rank0)
        self.recovered(fault)

    def kill_store(self) -> None:
        # The name the job's status gives: a store pod of an earlier run still terminating makes it take another.
        job = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            "elasticjob.dev", "v1alpha1", self.namespace, "elasticjobs", self.name)
        store = ((job.get("status") or {}).get("rendezvous") or {}).get("pod") or f"{self.name}-rdzv"
        self.view.say(f"$ python -m localcluster.faults kill-pod {self.namespace}/{store}     "
                      f"# SIGKILL the rendezvous store")
        fault = self.begin(f"SIGKILL the store pod ({store})", owns=("RendezvousLost",))
        lost_before = ((job.get("status") or {}).get("rendezvous") or {}).get("restarts") or 0
        self.signal_pod(store)
        self.trained_through(fault, lost_before)

    def steps_pass(self) -> None:
        step = self.snap.step or 0
        self.wait(lambda s: (s.step or 0) >= step + STEPS_BETWEEN, RECOVERY_TIMEOUT, f"{STEPS_BETWEEN} more steps")

    # --- faults and their cost --------------------------------------------------------------------------
    def begin(self, what: str, **identity) -> Fault:
        fault = Fault(what, time.time(), **identity)
        self.faults.append(fault)
        return fault

    def uid_of(self, pod: str) -> str | None:
        return next((p["metadata"].get("uid") for p in self.snap.pods if p["metadata"]["name"] == pod), None)

    def recovered(self, fault: Fault, world_size: int | None = None) -> None:
        try:
            first = self.wait(lambda s: first_step_after(s.records, fault.at, world_size), RECOVERY_TIMEOUT,
                              f"a training step after: {fault.what}")
        except StoryError as err:
            self.view.say(f"no step within {RECOVERY_TIMEOUT}s: {err}")
            return
        fault.seconds, fault.world_size = first["time"] - fault.at, first["world_size"]
        self.view.say(f"training again {fault.seconds:.1f}s later, at world size {fault.world_size} "
                      f"(step {first['step']})")

    def trained_through(self, fault: Fault, lost_before: int) -> None:
        """The store's loss: the workers train on while it comes back, and their agents resume the round there
        (or restart the workers through a new one). What it cost is the longest pause in the steps until a new
        store serves and the training has stepped on for AFTER_BACK seconds (or finished: a short job may)."""
        try:
            back = self.wait(lambda s: s.at if store_back(s.status, lost_before) or s.phase in FINISHED else None,
                             RECOVERY_TIMEOUT, f"a new store serving after: {fault.what}")
            self.wait(lambda s: s.phase in FINISHED or any(r["time"] >= back + AFTER_BACK for r in s.records),
                      RECOVERY_TIMEOUT, "the training stepping on after the store's return")
        except StoryError as err:
            self.view.say(f"no new store and steps within {RECOVERY_TIMEOUT}s: {err}")
            return
        records = self.snap.records if self.snap else []
        fault.seconds = longest_pause(records, fault.at, back + AFTER_BACK)
        fault.world_size = self.snap.world_size if self.snap else None
        restarted = first_step_after(records, fault.at) is not None
        fault.note = "workers restarted" if restarted else "workers trained on"
        self.view.say(f"the store is back; the {fault.note}: {fault.seconds:.1f}s the longest pause in the steps")

    def settle(self, snap: Snapshot) -> None:
        settle(self.faults, snap.status)

    # --- doing ------------------------------------------------------------------------------------------
    def kubectl(self, *args: str) -> None:
        if not shutil.which("kubectl"):
            raise StoryError("kubectl is not on PATH: run `make run`, or `eval \"$(localcluster env)\"` first")
        done = subprocess.run(["kubectl", "--namespace", self.namespace, *args], text=True, capture_output=True,
                              env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        if done.returncode != 0:
            raise StoryError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")

    def signal_pod(self, pod: str) -> None:
        if not faults.kill_pod(self.namespace, pod, 9, self.state_dir):
            raise StoryError(f"pod {pod} has no running container to kill")


class StoryError(RuntimeError):
    pass


def first_step_after(records: list[dict], when: float, world_size: int | None = None) -> dict | None:
    """The first step completed by a worker process that had written nothing before `when`."""
    old = {(r["host"], r["pid"], r["started"]) for r in records if r["time"] <= when}
    later = [r for r in records if r["time"] > when and (r["host"], r["pid"], r["started"]) not in old
             and (world_size is None or r["world_size"] == world_size)]
    return min(later, key=lambda r: r["time"], default=None)


def store_back(status: dict, lost_before: int) -> bool:
    """The operator counted the store's loss (status.rendezvous.restarts past `lost_before`) and a store serves."""
    found = status.get("rendezvous") or {}
    return bool(found.get("ready")) and (found.get("restarts") or 0) > lost_before


def longest_pause(records: list[dict], since: float, until: float) -> float:
    """The longest time between two steps of rank 0, from its step before `since` to `until`."""
    times = sorted(r["time"] for r in records if r["rank"] == 0)
    marks = [max((t for t in times if t <= since), default=since), *(t for t in times if since < t <= until)]
    return max((b - a for a, b in zip(marks, marks[1:])), default=0.0)


def settle(faults_seen: list[Fault], status: dict) -> None:
    """Each failure on record (status.lastFailures) goes to the fault that caused it: the one that killed its pod,
    the one whose kind of failure it is, or else the last fault before it (the operator may record a failure
    after the next fault began, so time alone is the last resort; times have whole seconds)."""
    found: dict[int, list[dict]] = {i: [] for i in range(len(faults_seen))}
    for failure in status.get("lastFailures") or []:
        cause = next((i for i, f in enumerate(faults_seen) if f.pod_uid and f.pod_uid == failure.get("uid")), None)
        if cause is None:
            cause = next((i for i, f in reversed(list(enumerate(faults_seen))) if failure.get("reason") in f.owns),
                         None)
        if cause is None:
            cause = next((i for i, f in reversed(list(enumerate(faults_seen))) if int(f.at) <= failure_time(failure)),
                         None)
        if cause is not None:
            found[cause].append(failure)
    for i, fault in enumerate(faults_seen):
        fault.charged = sum(1 for f in found[i] if f.get("charged", True))
        fault.reasons = tuple(f"{f.get('reason')}{'' if f.get('charged', True) else ' (not charged)'}"
                              for f in found[i])


def failure_time(failure: dict) -> float:
    stamp = failure.get("time")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


def summary(faults_seen: list[Fault]) -> Table:
    table = Table(title="what each fault cost", title_justify="left", box=box.SIMPLE_HEAD)
    for column, justify in (("fault", "left"), ("seconds to the next step", "right"), ("world size after", "right"),
                            ("charged to maxRestarts", "left")):
        table.add_column(column, justify=justify)
    for f in faults_seen:
        seconds = f"{f.seconds:.1f}" if f.seconds is not None else f"> {RECOVERY_TIMEOUT}"
        if f.note and f.seconds is not None:
            seconds += f" ({f.note}: the longest pause)"
        charged = "?" if f.charged is None else ("yes" if f.charged else "no")
        if f.charged:
            charged += f", {f.charged} restart{'s' if f.charged > 1 else ''}"
        if f.reasons:
            counted = Counter(f.reasons)
            charged += " (" + ", ".join(f"{n} x {r}" if n > 1 else r for r, n in counted.items()) + ")"
        table.add_row(f.what, seconds, str(f.world_size or "-"), charged)
    return table
