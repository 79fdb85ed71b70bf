"""What bench/goodput.py computes from what it saw, pure: the faults in turn, ETTR from the training's step records,
the ledger's incidents (status.goodput) gathered and summed per phase, and the rows of its tables.

ETTR is the share of the wall time spent on steps that count. Each of rank 0's step records (progress.jsonl,
examples/train_ddp.py) took the time since the record before it from the same worker process; a process's first
step took the typical step time (the time before it went to starting up). A step counts unless the same step
number was done again later (after a restart that restored an older checkpoint): of each step number only the last
record counts, so steps recomputed are lost time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime

from elasticjob.planner.goodput import PHASE_NAMES, wire_name

# The faults, drawn in turn (bench/goodput.py makes them): a worker's container killed, rank 0's, a node lost, a worker
# partitioned, the store killed, a scale down and up, a preemption, and two nodes that stay bad: a node sick (every
# training process there exits 1) and a worker slow (its CPU capped). Nine: a 20-minute window with a fault every 2
# minutes makes each once. `--quick` takes two that the ledger splits into every phase.
KINDS = ("worker", "rank0", "node", "partition", "store", "scale", "preemption", "sick", "slow")
QUICK_KINDS = ("rank0", "partition")
PHASES = tuple(wire_name(name) for name in PHASE_NAMES)
TOLERANCE = 0.10  # the ledger's sum against the measured loss: the target


@dataclass(frozen=True)
class Fault:
    at: float  # seconds into the measured window
    kind: str


def rotation(minutes: float, every_minutes: float, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """A fault every `every_minutes` inside the window (none at its very end: its loss would fall outside),
    the kinds in turn."""
    if every_minutes <= 0 or not kinds:
        return []
    faults: list[Fault] = []
    at = every_minutes
    while at < minutes - 1e-9:
        faults.append(Fault(round(at * 60, 3), kinds[len(faults) % len(kinds)]))
        at += every_minutes
    return faults


def process(record: dict) -> tuple:
    """Which worker process wrote a record: pod names and PIDs repeat across pods and restarts."""
    return record["host"], record["pid"], record["started"]


def step_spans(records: list[dict]) -> list[tuple[float, float, int | None]]:
    """(start, end, world size) of each of rank 0's steps that count, oldest first."""
    rank0 = sorted((r for r in records if r.get("rank") == 0), key=lambda r: r["time"])
    last_of_step = {r["step"]: r["time"] for r in rank0}
    previous: dict[tuple, float] = {}
    spans: list[tuple[float, float | None, int | None]] = []
    for record in rank0:
        before = previous.get(process(record))
        previous[process(record)] = record["time"]
        if last_of_step[record["step"]] != record["time"]:
            continue  # done again later: lost
        spans.append((record["time"], None if before is None else record["time"] - before, record.get("world_size")))
    known = [took for _, took, _ in spans if took is not None]
    typical = statistics.median(known) if known else 0.0
    return [(end - (typical if took is None else took), end, world) for end, took, world in spans]


def full_size(records: list[dict]) -> int | None:
    """The job's world size at full size: the largest any step ran at (the bench starts it at full size)."""
    return max((r["world_size"] for r in records if r.get("world_size")), default=None)


def productive_seconds(records: list[dict], start: float, end: float, full: int | None = None) -> float:
    """Seconds of [start, end] spent on steps that count; with `full`, each weighted by its world size over
    `full` (a step trained by 2 of 3 nodes is two thirds of a step)."""
    def weight(world: int | None) -> float:
        return 1.0 if not full or not world else min(1.0, world / full)
    return sum(max(0.0, min(b, end) - max(a, start)) * weight(world) for a, b, world in step_spans(records))


def ettr(records: list[dict], start: float, end: float, weighted: bool = False) -> float | None:
    """Percent of [start, end] spent on steps that count; `weighted`: by world size over the full size. None for
    an empty window."""
    if end <= start:
        return None
    full = full_size(records) if weighted else None
    return 100.0 * productive_seconds(records, start, end, full) / (end - start)


def lost_per_fault(records: list[dict], start: float, end: float, faults: list[Fault]) -> list[tuple[str, float]]:
    """Each fault's kind and the seconds not spent on counted steps around it: from halfway since the fault
    before (or the window's start) to halfway to the next (or the end). The steps recomputed for a fault ran
    before it, the downtime after it; faults minutes apart keep both on their side of the halfway marks."""
    found = []
    marks = [start + f.at for f in faults]
    for i, fault in enumerate(faults):
        begin = start if i == 0 else (marks[i - 1] + marks[i]) / 2
        until = end if i + 1 == len(faults) else (marks[i] + marks[i + 1]) / 2
        found.append((fault.kind, (until - begin) - productive_seconds(records, begin, until)))
    return found


# --- the ledger (status.goodput) -----------------------------------------------------------------------------


def parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def gather(seen: dict[tuple[str, str], dict], goodput: dict | None) -> None:
    """Adds the closed incidents a read of status.goodput shows: it keeps only the last few, so the bench reads
    it often and keeps every one it saw, once."""
    for incident in (goodput or {}).get("lastIncidents") or []:
        seen[(incident.get("kind", ""), incident.get("startTime", ""))] = incident


def in_window(incidents: list[dict], start: float, end: float) -> list[dict]:
    return [i for i in incidents if i.get("startTime") and start <= parse_time(i["startTime"]) <= end]


def phase_sums(incidents: list[dict]) -> dict[str, float | None]:
    """Each phase's seconds over the incidents; None for a phase no incident knew."""
    sums: dict[str, float | None] = {}
    for phase in PHASES:
        known = [v for i in incidents if (v := (i.get("phases") or {}).get(phase)) is not None]
        sums[phase] = round(sum(known), 3) if known else None
    return sums


def ledger_lost(incidents: list[dict]) -> float:
    return round(sum(i.get("lostSeconds") or 0.0 for i in incidents), 3)


def agrees(measured: float, ledger: float, tolerance: float = TOLERANCE) -> bool:
    """The ledger's sum within `tolerance` of the measured loss (both nothing counts as agreeing)."""
    if measured <= 0:
        return ledger <= 0
    return abs(ledger - measured) <= tolerance * measured


# --- the tables ----------------------------------------------------------------------------------------------


@dataclass
class Result:
    setup: str
    wall: float
    ettr: float | None
    measured_lost: float
    per_fault: list[tuple[str, float]]
    incidents: list[dict] | None  # None: no ledger (no operator)
    skipped: list[str]
    start: float = 0.0  # the window's start (unix seconds)
    weighted: float | None = None  # ETTR with each step weighted by its world size over the full size


def summary_rows(results: list[Result]) -> list[list[str]]:
    header = ["setup", "ETTR %", "weighted %", "lost s (measured)", "lost s (ledger)", "within 10%", *PHASES, "skipped"]
    rows = [header]
    for r in results:
        ledger = None if r.incidents is None else ledger_lost(r.incidents)
        sums = phase_sums(r.incidents) if r.incidents is not None else {}
        rows.append([r.setup, "-" if r.ettr is None else f"{r.ettr:.2f}",
                     "-" if r.weighted is None else f"{r.weighted:.2f}", f"{r.measured_lost:.1f}",
                     "-" if ledger is None else f"{ledger:.1f} ({len(r.incidents or [])})",
                     "-" if ledger is None else ("yes" if agrees(r.measured_lost, ledger) else "no"),
                     *("-" if sums.get(p) is None else f"{sums[p]:.1f}" for p in PHASES),
                     ", ".join(r.skipped) or "-"])
    return rows


def per_kind_rows(results: list[Result]) -> list[list[str]]:
    """Seconds lost per fault, by kind: the median over the faults of that kind, per setup."""
    kinds = [k for k in KINDS if any(kind == k for r in results for kind, _ in r.per_fault)]
    rows = [["fault", *(r.setup for r in results)]]
    for kind in kinds:
        cells = []
        for r in results:
            lost = [s for k, s in r.per_fault if k == kind]
            cells.append(f"{statistics.median(lost):.1f} ({len(lost)})" if lost else "-")
        rows.append([kind, *cells])
    return rows


def incident_rows(result: Result, start: float) -> list[list[str]]:
    """Each incident the ledger closed in the window: when, what, its loss and phases (where the seconds went)."""
    rows = [["at s", "kind", "reason", "lost s", *PHASES]]
    for i in sorted(result.incidents or [], key=lambda i: i["startTime"]):
        phases = i.get("phases") or {}
        rows.append([f"{parse_time(i['startTime']) - start:.1f}", i.get("kind", ""), i.get("reason", ""),
                     f"{i.get('lostSeconds') or 0.0:.1f}",
                     *("-" if phases.get(p) is None else f"{phases[p]:.1f}" for p in PHASES)])
    return rows


def render(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
    lines.insert(1, " | ".join("-" * w for w in widths))
    return "\n".join(lines)
