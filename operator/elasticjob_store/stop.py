"""Planned stops, the store's side: the step every rank of the training stops after, picked from its latest
progress report, and where the ranks read it (elasticjob_progress/stop.py keeps the same keys; a unit test keeps
them equal). Pure but for the keys' names.

The rule: the training may have stepped since its report was made, and every rank must learn the step before it
gets there. So the step is the report's, plus the steps its step time fits into the time since (the report's age
when sent, on the worker's clock, and since it arrived, on this store's: no two clocks are compared), plus the
margin the operator gives for the news to reach every rank, rounded up, plus one. Reports come at most once a
second and the ranks learn a stop within a store round trip (they wait on its key), so a margin of 2 s leaves
more than a second to spare. A report older than MAX_AGE says the training is not stepping at that pace: its
age counts up to that much.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# How many stops this store has written: stop n is under STOP_PREFIX + n. A rank reads the latest count's key.
COUNT_KEY = "elasticjob.stops"
STOP_PREFIX = "elasticjob.stop."
# Every rank adds 1 under this prefix + the stop's id once it saved; rank 0 reports the stop when all did.
DONE_PREFIX = "elasticjob.stopped."
# A worker's agent adds 1 here when its pod is told to go without the operator having asked (an eviction, a
# node drain: the kubelet's SIGTERM; elasticjob_warm/evicted.py). The store then writes a stop as the operator's
# would. Whoever reaches the store's port may add to it, as to every key here: it grants nothing they lack.
REQUEST_KEY = "elasticjob.stop-requests"
# The margin of a worker's request: the operator's own (elasticjob/planner/planned_stop.py MARGIN_SECONDS).
REQUEST_MARGIN = 2.0
MAX_AGE = 10.0
# A count as the TCPStore's add writes it: a decimal 64-bit integer.
_COUNT = re.compile(rb"-?[0-9]{1,19}")
# How often next_number tries again when another writer changed the count between its read and its write.
NUMBER_TRIES = 8


def stop_key(n: int) -> str:
    return f"{STOP_PREFIX}{n}"


def stop_id(requested_at: float) -> str:
    """The stop's name on the wire and in the keys: the operator's request time, to the millisecond."""
    return f"{requested_at:.3f}"


def agreed_step(report: dict[str, Any] | None, received_at: float | None, now: float,
                margin: float) -> int | None:
    """The step to stop after, by the rule above; None without a step and a step time to go on."""
    if report is None or received_at is None:
        return None
    step, seconds = report.get("step"), report.get("stepSeconds")
    if step is None or not seconds:
        return None
    sent, stepped = report.get("sentAt"), report.get("stepAt")
    lag = max(0.0, sent - stepped) if sent is not None and stepped is not None else 0.0
    age = min(MAX_AGE, lag + max(0.0, now - received_at))
    return int(step) + math.ceil(round((age + margin) / float(seconds), 6)) + 1  # 2.2 / 0.1 is 22, not 23


def under_way(stop_step: int | None, report: dict[str, Any] | None) -> bool:
    """Whether the latest stop (its step) still applies to the training of `report`: its process began no later
    than the step and has not stepped past it (it is stopping, or stopped and holds). A worker's request is then
    answered by that stop; otherwise a new one is written."""
    if stop_step is None or report is None:
        return False
    first, step = report.get("firstStep"), report.get("step")
    return first is not None and first <= stop_step and (step is None or step <= stop_step)


def record(requested_at: float, step: int, now: float) -> bytes:
    """What the ranks read under the stop's key."""
    return json.dumps({"v": 1, "id": stop_id(requested_at), "step": step, "at": round(now, 3)},
                      separators=(",", ":")).encode()


def parse_count(raw: bytes) -> int | None:
    """The count in `raw` as the TCPStore's add writes it; None for anything else."""
    if not _COUNT.fullmatch(raw):
        return None
    value = int(raw)
    return value if -(2**63) <= value < 2**63 else None


def count(store: Any, key: str) -> int | None:
    """The count under `key` (0 where there is none), read with check and get, never add: a TCPStore server
    answers an add to a value that is not a 64-bit integer by closing the client's connection (its stoll throws),
    and a client never reconnects. Measured: one set of b"x" under REQUEST_KEY by anyone on the store's port, and
    every poll of the store's Control raised DistNetworkError after it, until the pod restarted. None: the value
    is no count."""
    return parse_count(store.get(key)) if store.check([key]) else 0


def next_number(store: Any) -> int:
    """The number the next stop is written under, counted under COUNT_KEY with compare_set, never add (see
    count()): one more than the count there, and 1 where the value is no count (replaced, so that the ranks'
    adds work again). Raises RuntimeError when other writers changed the count NUMBER_TRIES times in a row."""
    for _ in range(NUMBER_TRIES):
        raw = store.get(COUNT_KEY) if store.check([COUNT_KEY]) else b""
        n = (parse_count(raw) or 0) + 1 if raw else 1
        if n >= 2**63:
            n = 1
        wanted = str(n).encode()
        if store.compare_set(COUNT_KEY, raw, wanted) == wanted:
            return n
    raise RuntimeError(f"the count under {COUNT_KEY} changed {NUMBER_TRIES} times while a stop was written")
