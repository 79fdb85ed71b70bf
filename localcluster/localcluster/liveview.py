"""What `make run` shows while a job runs: one snapshot of the job, drawn in place on a terminal (rich.live) or
as plain lines when the output is a pipe or CI's log.

A snapshot is read from the API server (the job's status, its pods, the operator's Events on it) and from what
training wrote (examples/train_ddp.py's progress.jsonl); everything below it is pure and unit-tested.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
EVENTS_SHOWN = 6
STEP_LINES_EVERY = 5.0  # seconds: in plain output a line that only moves the step waits this long


@dataclass
class Snapshot:
    status: dict
    pods: list[dict]  # the job's worker pods
    events: list[dict]  # the job's Events, oldest first
    records: list[dict]  # progress.jsonl: one per completed step and rank
    at: float = field(default_factory=time.time)

    @property
    def phase(self) -> str:
        return self.status.get("phase") or "Pending"

    @property
    def last(self) -> dict | None:
        return max(self.records, key=lambda r: r["time"], default=None)

    @property
    def step(self) -> int | None:
        return self.last["step"] if self.last else None

    @property
    def world_size(self) -> int | None:
        return self.last["world_size"] if self.last else None


def read_records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # the line being written right now
    return records


def observe(api: client.ApiClient, namespace: str, name: str, progress: Path) -> Snapshot:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    pods = core.list_namespaced_pod(namespace, label_selector=f"elasticjob.dev/job-name={name},"
                                    "elasticjob.dev/role=worker", _preload_content=False)
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.kind=ElasticJob,"
                                        f"involvedObject.name={name}", _preload_content=False)
    uid = job["metadata"]["uid"]
    mine = [e for e in json.loads(events.data)["items"] if e["involvedObject"].get("uid") == uid]
    return Snapshot(job.get("status") or {}, json.loads(pods.data)["items"], sorted(mine, key=event_time),
                    read_records(progress))


def event_time(event: dict) -> str:
    return event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp") or ""


def pod_state(pod: dict) -> str:
    """running, starting, terminating, succeeded or failed: what a reader wants to know of a worker."""
    if pod["metadata"].get("deletionTimestamp"):
        return "terminating"
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return phase.lower()
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return "running" if statuses and all("running" in (s.get("state") or {}) for s in statuses) else "starting"


def workers(pods: list[dict]) -> str:
    counts = Counter(pod_state(p) for p in pods)
    order = ("running", "starting", "terminating", "succeeded", "failed")
    return ", ".join(f"{counts[s]} {s}" for s in order if counts[s]) or "none"


def event_line(event: dict) -> str:
    stamp = event_time(event)[11:19]
    return f"{stamp} {event.get('type', 'Normal'):<7} {event.get('reason', ''):<22} {event.get('message', '')}"


def plain_line(snap: Snapshot) -> str:
    """One line per change, for a pipe or a CI log."""
    training = f"step {snap.step} at world size {snap.world_size}" if snap.step is not None else "no step yet"
    return (f"{snap.phase:<10} workers: {workers(snap.pods):<28} {training:<26} "
            f"restarts {snap.status.get('restarts', 0)}")


def state_key(snap: Snapshot) -> tuple:
    """What a plain line is printed for at once: everything but the step."""
    return snap.phase, workers(snap.pods), snap.world_size, snap.status.get("restarts", 0)


def panel(snap: Snapshot, title: str) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("job", title)
    head.add_row("phase", Text(snap.phase, style=PHASE_STYLE.get(snap.phase, "")))
    head.add_row("workers", workers(snap.pods))
    head.add_row("world size", str(snap.world_size or "-"))
    head.add_row("training step", str(snap.step if snap.step is not None else "-"))
    head.add_row("restarts", f"{snap.status.get('restarts', 0)} charged, "
                 f"{snap.status.get('infrastructureFailures', 0)} infrastructure failures (not charged)")
    events = Table(title="latest Events on the job", title_justify="left", show_edge=False, box=None)
    for column in ("time", "type", "reason", "message"):
        events.add_column(column, overflow="fold" if column == "message" else "ellipsis")
    for event in snap.events[-EVENTS_SHOWN:]:
        events.add_row(event_time(event)[11:19], event.get("type", ""), event.get("reason", ""),
                       event.get("message", ""))
    return Group(Text(""), head, Text(""), events)


PHASE_STYLE = {"Running": "green", "Succeeded": "bold green", "Restarting": "yellow", "Failed": "bold red"}


class View:
    """Redraws the snapshot in place on a terminal; elsewhere prints a line whenever it changes, and new Events."""

    def __init__(self, title: str, console: Console | None = None):
        self.console = console or Console()
        self.title = title
        self.live: Live | None = None
        self.last_key: tuple | None = None
        self.last_step: int | None = None
        self.last_print = 0.0
        self.events_seen: set[str] = set()
        self.snapshot: Snapshot | None = None

    @property
    def interactive(self) -> bool:
        return self.console.is_terminal

    def __enter__(self) -> View:
        if self.interactive:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def say(self, text: str) -> None:
        """A line of the story (what is done, the command a user would type); above the live view on a terminal."""
        self.console.print(f"[{time.strftime('%H:%M:%S')}] {text}", highlight=False, soft_wrap=True, markup=False)

    def update(self, snap: Snapshot) -> None:
        self.snapshot = snap
        if self.live is not None:
            self.redraw()
            return
        for event in snap.events:
            key = event["metadata"].get("uid") or event["metadata"]["name"]
            if key not in self.events_seen:
                self.events_seen.add(key)
                self.console.print(f"[{time.strftime('%H:%M:%S')}]   event {event_line(event)}", highlight=False,
                                   soft_wrap=True, markup=False)
        key, now = state_key(snap), time.monotonic()
        stepped = snap.step != self.last_step and now - self.last_print >= STEP_LINES_EVERY
        if key != self.last_key or stepped or snap.phase in ("Succeeded", "Failed") and snap.step != self.last_step:
            self.console.print(f"[{time.strftime('%H:%M:%S')}] {plain_line(snap)}", highlight=False, soft_wrap=True,
                               markup=False)
            self.last_key, self.last_step, self.last_print = key, snap.step, now

    def redraw(self) -> None:
        if self.live is not None and self.snapshot is not None:
            self.live.update(panel(self.snapshot, self.title))

    def final_frame(self) -> None:
        """The last state, once more, in plain text: what a log (or docs/behaviour.md) keeps of the live view."""
        if self.snapshot is not None and self.live is None:
            self.console.print(panel(self.snapshot, self.title))
