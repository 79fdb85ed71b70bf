"""A pod told to go that the operator did not remove (an eviction, a node drain): the training saves first.

The Eviction API (`kubectl drain`, the taint manager) has the kubelet send SIGTERM to the pod's first process at
once: the operator cannot hold the pod as it does before a scale-down (elasticjob/planner/planned_stop.py), so this
process, torchrun's agent, does. Its SIGTERM handler asks the job's store for a stop (it adds 1 under
REQUEST_KEY; the store picks the step as for the operator's stop, elasticjob_store/stop.py), lets the agent run
on while every rank learns the step, saves it and says so (elasticjob_progress's should_stop and stopped: rank
0's report then carries the stop), and only then sends itself SIGTERM again: torchrun shuts its workers down as
it always did. At most ELASTICJOB_STOP_GRACE_SECONDS (the job's runPolicy.stopGraceSeconds, set by the
operator; the pod's terminationGracePeriodSeconds covers it and torchrun's own 30 s): past it, or where the
training does not listen, there is no store, or the ranks already stopped at the latest stop (the operator's,
before it removed this pod), the agent goes on at once, as without it.

The agent reaches the store through the rendezvous port its workers already use, where anyone may add to any
key: asking for a stop lets it do nothing it could not do before, and it holds no control token. The keys are
the store's (a unit test keeps them equal); the agent may not import the store's modules.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from types import FrameType
from typing import Any, Optional  # Optional: an alias is evaluated, on Python 3.9 too

from elasticjob_warm import notice

REQUEST_KEY = "elasticjob.stop-requests"
PROGRESS_KEY = "elasticjob.progress"
COUNT_KEY = "elasticjob.stops"
STOP_PREFIX = "elasticjob.stop."
GRACE_ENV = "ELASTICJOB_STOP_GRACE_SECONDS"
POLL = 0.2
CONNECT_TIMEOUT = 3.0
# A plain connect to the store first, for this long at most. A pod deleted at once (grace 0: a force deletion, a
# lost node's eviction) is gone from the API while its kubelet gives it 2 s: the job's network policy no longer
# lists it, so its new connections are dropped (measured: a connect timed out; its old ones still work), and a
# TCPStore client waited CONNECT_TIMEOUT while the workers trained on, steps the next world did again, and the
# survivors waited on this pod until the kubelet's SIGKILL. A store that answers does within milliseconds.
PROBE_TIMEOUT = 0.5
# ... and without enforcement the connect succeeds, but the store's gate closes it unread once the operator took the
# pod off the job's list: the probe waits this long for that close. A connection the gate passes stays open and
# silent (the store speaks only when asked); a new TCPStore client would instead retry the refusal for its
# CONNECT_TIMEOUT, past the kubelet's kill.
REFUSAL_WAIT = 0.15

Stop = tuple[str, int]  # the latest stop in the store: its id and its step
Handler = Callable[[int, Optional[FrameType]], None]


class Next(Enum):
    GO = "go"  # nothing to save first: torchrun shuts down now
    ASK = "ask"  # ask for a stop and wait until every rank saved it
    DONE = "done"  # every rank saved the latest stop: torchrun shuts down now


def grace_seconds(environ: dict[str, str]) -> float:
    value = environ.get(GRACE_ENV, "")
    return float(value) if value.isdigit() else 0.0


def stopped(report: dict[str, Any] | None, latest: Stop | None) -> bool:
    """Whether rank 0 reported that every rank saved the latest stop's step."""
    mark = report.get("stopped") if report is not None else None
    return latest is not None and isinstance(mark, dict) and mark.get("step") == latest[1]


def first_look(report: dict[str, Any] | None, latest: Stop | None, grace: float) -> Next:
    """What SIGTERM starts, from rank 0's latest report and the store's latest stop. Pure."""
    if stopped(report, latest):
        return Next.DONE
    if grace <= 0 or report is None or not report.get("listens") or report.get("step") is None \
            or not report.get("stepSeconds"):
        return Next.GO  # a script that never asks should_stop, or nothing stepped: no step to agree on
    return Next.ASK


def parse_stop(raw: bytes) -> Stop | None:
    try:
        body = json.loads(raw)
    except Exception:  # noqa: BLE001 - not JSON, or nested too deep for the parser (RecursionError): no stop
        return None
    if not isinstance(body, dict) or not isinstance(body.get("id"), str) or type(body.get("step")) is not int:
        return None
    return body["id"], body["step"]


def parse_report(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except Exception:  # noqa: BLE001 - as parse_stop
        return None
    return body if isinstance(body, dict) else None


class StoreView:
    """What the agent reads of the job's store: rank 0's report and the latest stop."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def report(self) -> dict[str, Any] | None:
        return parse_report(self.store.get(PROGRESS_KEY)) if self.store.check([PROGRESS_KEY]) else None

    def latest(self) -> Stop | None:
        count = int(self.store.add(COUNT_KEY, 0))
        key = f"{STOP_PREFIX}{count}"
        return parse_stop(self.store.get(key)) if count and self.store.check([key]) else None

    def ask(self) -> None:
        self.store.add(REQUEST_KEY, 1)


def save_first(view: StoreView, grace: float, say: Callable[[str], None],
               clock: Callable[[], float] = time.monotonic) -> Next:
    """Asks for a stop where one is worth it and waits until every rank saved it, `grace` seconds at most."""
    deadline = clock() + grace
    found = first_look(view.report(), view.latest(), grace)
    if found != Next.ASK:
        return found
    view.ask()
    say(f"SIGTERM: asked the training to stop after a step all ranks agree on and save it (at most {grace:g}s)")
    while clock() < deadline:
        latest = view.latest()
        if stopped(view.report(), latest):
            assert latest is not None
            say(f"every rank saved step {latest[1]}: the workers stop now")
            return Next.DONE
        time.sleep(POLL)  # polls the store, where the ranks elsewhere report: no condition in this process
    say(f"the training did not stop and save within {grace:g}s: the workers stop without it")
    return Next.GO


def connect(address: str) -> Any:
    """A client of the job's store; raises OSError at once where no new connection gets through."""
    import torch.distributed

    host, number = notice.host_port(address)
    probe(host, number)
    dist: Any = torch.distributed  # TCPStore is not in its stubs
    return dist.TCPStore(host, number, is_master=False, timeout=timedelta(seconds=CONNECT_TIMEOUT))


def probe(host: str, number: int) -> None:
    """Raises OSError at once where no new connection gets through, or where the store refuses this pod."""
    with socket.create_connection((host, number), timeout=PROBE_TIMEOUT) as sock:
        sock.settimeout(REFUSAL_WAIT)
        try:
            closed = sock.recv(1) == b""
        except socket.timeout:
            return  # open and silent: passed (or held, for a pod the operator has not named yet)
        if closed:
            raise ConnectionRefusedError("the job's store closed the connection unread: it refuses this pod")


class Guard:
    """Stands in front of torchrun's SIGTERM handler: the first SIGTERM starts save_first in a thread and returns
    (the agent runs on), which then sends SIGTERM again; that one, and any other signal, goes to torchrun."""

    def __init__(self, address: str, grace: float, say: Callable[[str], None]) -> None:
        self.address, self.grace, self.say = address, grace, say
        self._begun = False
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def wrap(self, original: Handler) -> Handler:
        def handler(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGTERM and self._begin():
                return
            original(signum, frame)
        return handler

    def _begin(self) -> bool:
        with self._lock:
            if self._begun:
                return False
            self._begun = True
        self.thread = threading.Thread(target=self._run, name="elasticjob-save-first", daemon=True)
        self.thread.start()
        return True

    def _run(self) -> None:
        try:
            save_first(StoreView(connect(self.address)), self.grace, self.say)
        except Exception as error:  # noqa: BLE001 - a lost store: the workers stop as they would have
            self.say(f"SIGTERM: no stop asked ({type(error).__name__}: {error}); the workers stop now")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)


def install(address: str | None, environ: dict[str, str]) -> Guard | None:
    """Puts a Guard in front of the handler torchrun's agent sets for SIGTERM each time it starts its workers
    (torch.distributed.elastic.multiprocessing.api._terminate_process_handler, looked up then by name). None,
    and torchrun as it is, without a store or a grace, or on a torch without that handler."""
    grace = grace_seconds(environ)
    if not address or grace <= 0:
        return None
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api, "_terminate_process_handler", None)
    if original is None:
        return None
    guard = Guard(address, grace, say)
    setattr(api, "_terminate_process_handler", guard.wrap(original))  # noqa: B010 - torch's private name
    return guard


def say(message: str) -> None:
    print(f"elasticjob_warm.torchrun: {message}", file=sys.stderr, flush=True)
