"""The store-side loop: read the rendezvous state, apply an action, write it back the way the agents do.

Agents update the state with compare_set(key, old_bytes, new_bytes): the whole old value is the fencing token,
and a writer that lost the race re-reads and redoes its action. We write the same way, so an agent's
heartbeat or join that lands between our read and our write is never overwritten; we redo our action on top
of it instead. A background poller feeds the RoundTracker and takes the restart waiter out once the round it
was meant to end has ended.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from elasticjob_store import actions, compat, links, nodechecks, pace, peers, protocol, seats, stop
from elasticjob_store.actions import Outcome
from elasticjob_store.agent_reports import AgentReports, Store
from elasticjob_store.progress import KEY as PROGRESS_KEY
from elasticjob_store.progress import ProgressReader
from elasticjob_store.protocol import StopReply
from elasticjob_store.protocol_state import PeersWire, PlainTorchrunWire, StopWire, TorchWire
from elasticjob_store.report import summary
from elasticjob_store.rounds import RoundTracker
from elasticjob_store.seating import Seating
from elasticjob_store.state import RendezvousState, StateError, decode, encode, state_key

WRITE_ATTEMPTS = 8
POLL_INTERVAL = 0.25
# A waiter the agents have not answered within this long is taken out anyway (the agents' own _sanitize
# drops it after keep_alive_interval x keep_alive_max_attempt, but only in their copies until one writes).
WAITER_TTL = 15.0


class ConflictError(RuntimeError):
    """Every attempt to write lost a race with the agents."""


class Control(AgentReports, Seating):
    def __init__(self, store: Store, run_id: str, min_nodes: int, max_nodes: int, *,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] = print,
                 stale_after: float = 1e9, verdict: compat.Verdict | None = None,
                 tables: Callable[[], peers.Reading | None] | None = None,
                 gate: Callable[[], PeersWire] | None = None, seat_count: int | None = None) -> None:
        self.run_id = run_id
        # The gate's report (gate.py): a change of whom it answers or refuses wakes the operator like a round's.
        self.gate = gate
        # Off on a torch the nudges were not proven on (compat.py): every nudge is then refused unread.
        self.verdict = verdict or compat.Verdict("", True, "not checked")
        self.stale_after = stale_after
        # Bumped whenever the summary the operator decides on changes; long-polls wait on `changed`.
        self.version = 0
        self.changed = threading.Condition()
        self._summary: tuple[Any, ...] | None = None
        self.key = state_key(run_id)
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.tracker = RoundTracker()
        self._first_hold: tuple[int, float] = (-1, 0.0)  # the round held last, and when its first hold came
        self._store = store
        self._clock = clock
        self._log = log
        # One TCPStore client serves the HTTP threads and the poller; the old script also serialised its use.
        self._store_lock = threading.Lock()
        # Guards the tracker and the waiter bookkeeping, which HTTP threads read while the poller writes.
        self.lock = threading.Lock()
        self._decoded: tuple[bytes, RendezvousState | None] = (b"", None)
        self._waiter_round: int | None = None
        self._waiter_added_at = 0.0
        # The training's own report (elasticjob_progress): read at each tick, shown to the operator, never acted on.
        self.progress = ProgressReader()
        # Each rank's pace (elasticjob_progress/pace.py): read every few ticks, shown to the operator per pod.
        self.pace = pace.PaceReader()
        # What each member's node check cost its join (nodechecks.py): shown to the operator for its ledger.
        self.node_checks = nodechecks.NodeCheckReader()
        # The latest round's link probe verdict (links.py): shown to the operator, who may replace its outlier.
        self.links = links.LinkReader()
        # The planned stop this store last wrote (stop.py): its id, step and when; shown in GET /v1/state.
        self.stop_record: StopWire | None = None
        self._requests_seen = 0  # the workers' stop requests taken (stop.REQUEST_KEY)
        # The kernel's connection tables for the store's port (peers.read), once a tick: who is connected (an
        # agent's departure) and who answers no keep-alive probe (since when: shown). None: neither is seen.
        self._tables = tables
        self._departures = peers.Departures()
        self.silences = peers.Silences()
        # The seats of a job with spares (seats.py): how many agents may be in its rounds; None, every agent.
        self.seats = seats.Seats(seat_count)
        self.seat_epoch = secrets.token_hex(4)  # an agent that asked a store before this one asks again
        self._held_written = b""

    def log(self, message: str) -> None:
        when = datetime.fromtimestamp(self._clock(), timezone.utc).isoformat(timespec="milliseconds")
        self._log(f"{when} [rendezvous {self.run_id}] {message}")

    def now(self) -> float:
        return self._clock()

    def read(self) -> tuple[bytes, RendezvousState | None]:
        """The raw bytes under the key and the state they hold. Raises StateError for a state we refuse."""
        raw = self.read_raw()
        return raw, self._decode(raw)

    def read_raw(self) -> bytes:
        with self._store_lock:
            # get() would block until the key exists; the agents create it when their backend starts.
            return self._store.get(self.key) if self._store.check([self.key]) else b""

    def _decode(self, raw: bytes) -> RendezvousState | None:
        # The poller reads four times a second and the state rarely changes: decode each value once.
        # Actions copy before they change anything, so sharing the decoded object is safe.
        if not self.verdict.nudges and not self._checking_in_range():
            return None  # torch's private state is read only where its shape was proven (compat.py)
        cached_raw, cached_state = self._decoded
        if raw == cached_raw:
            return cached_state
        state = decode(raw)
        self._decoded = (raw, state)
        return state

    def apply(self, action: Callable[[RendezvousState | None], Outcome]) -> Outcome:
        """Runs `action` on the current state and writes its result, fenced by the bytes it read.

        A lost race returns the value that won; the action is redone on it. Raises ConflictError after
        WRITE_ATTEMPTS lost races, StateError when the stored state is one we refuse to decode.
        """
        raw, state = self.read()
        for _ in range(WRITE_ATTEMPTS):
            outcome = action(state)
            if outcome.state is None:
                return outcome
            new_raw = encode(outcome.state)
            with self._store_lock:
                current = self._store.compare_set(self.key, raw, new_raw)
            if current == new_raw:  # how torch's backend learns that its write took effect, too
                return outcome
            raw, state = current, self._decode(current)
        raise ConflictError(f"lost {WRITE_ATTEMPTS} races with the agents writing the rendezvous state")

    def _utc(self, unix: float) -> datetime:
        return datetime.fromtimestamp(unix, timezone.utc)

    def torch_report(self) -> TorchWire:
        return {**self.verdict.report(), "plainTorchrun": self._plain_torchrun()}

    def _plain_torchrun(self) -> PlainTorchrunWire | None:
        """Whether an agent's warm wrapper ran plain torchrun instead (it says so in this store)."""
        with self._store_lock:
            if not self._store.check([compat.PLAIN_KEY, compat.PLAIN_WHY_KEY]):  # get() would wait for both
                return None
            agents, why = self._store.get(compat.PLAIN_KEY), self._store.get(compat.PLAIN_WHY_KEY)
        # Anyone who reaches the store's port can write these: they are shown, capped, and never acted on.
        count = int(agents) if agents.isdigit() and len(agents) < 12 else 0
        return {"agents": count, "why": why[:compat.MAX_WHY].decode(errors="replace")}

    def _checking_in_range(self) -> bool:
        """compat.probe still runs, on a torch whose version is in the range: the state is read (the decoder takes
        exactly torch's fields, or refuses) and the first round's hold taken, for the first round forms meanwhile;
        the hold rewrites one time of a state just decoded. Every other nudge waits for the verdict."""
        return self.verdict.checking and compat.in_range(self.verdict.torch)

    def _refused(self, what: str) -> Outcome | None:
        if self.verdict.nudges:
            return None
        self.log(f"{what}: refused, nudges are off ({self.verdict.why})")
        return Outcome(None, False, f"nudges are off: {self.verdict.why}", refused=True)

    def remove(self, addr: str, heartbeat_before: float) -> Outcome:
        if refused := self._refused(f"remove addr={addr}"):
            return refused
        before = self._utc(heartbeat_before)
        outcome = self.apply(lambda state: actions.remove_node(state, addr, before, self.min_nodes,
                                                               self._members(state)))
        self.log(f"remove addr={addr} heartbeatBefore={heartbeat_before:.3f}: {outcome.reason}"
                 + (f" ({', '.join(map(repr, outcome.nodes))})" if outcome.nodes else ""))
        if outcome.nodes:
            self.release_seat(addr)
        return outcome

    def _members(self, state: RendezvousState | None) -> tuple[str, ...] | None:
        if state is None:
            return None
        with self.lock:
            return self.tracker.members(state.round)

    def complete(self, live_nodes: int) -> Outcome:
        if refused := self._refused(f"complete liveNodes={live_nodes}"):
            return refused
        now = self._utc(self.now())
        outcome = self.apply(lambda state: actions.complete_round(state, live_nodes, self.min_nodes,
                                                                  self.max_nodes, now))
        self.log(f"complete liveNodes={live_nodes}: {outcome.reason}")
        return outcome

    def hold(self, round_seen: int, seconds: float) -> tuple[Outcome, float | None]:
        """hold_round up to `seconds` after this store's first hold of the round: asked again, it is not held
        longer. Returns the outcome and the time held until (unix seconds; None when not held)."""
        if not self._checking_in_range() and (refused := self._refused(f"hold round={round_seen}")):
            return refused, None
        with self.lock:
            if self._first_hold[0] != round_seen:
                self._first_hold = (round_seen, self.now())
            until = self._first_hold[1] + min(seconds, protocol.MAX_HOLD)
        outcome = self.apply(lambda state: actions.hold_round(state, round_seen, self._utc(until)))
        self.log(f"hold round={round_seen} seconds={seconds:g}: {outcome.reason}")
        return outcome, until if outcome.done else None

    def restart(self, round_seen: int) -> Outcome:
        if refused := self._refused(f"restart round={round_seen}"):
            return refused
        now = self.now()
        # Recorded before the write: the poller must not take out a waiter it has not been told about.
        with self.lock:
            previous = (self._waiter_round, self._waiter_added_at, self.tracker.restart_of)
            self._waiter_round, self._waiter_added_at = round_seen, now
            self.tracker.note_restart(round_seen)
        outcome = None
        try:
            outcome = self.apply(lambda state: actions.add_waiter(state, round_seen, self._utc(now)))
        finally:
            if outcome is None or outcome.state is None:  # nothing written: forget what we recorded
                with self.lock:
                    self._waiter_round, self._waiter_added_at, self.tracker.restart_of = previous
        self.log(f"restart round={round_seen}: {outcome.reason}")
        return outcome

    def reopen(self, round_seen: int) -> Outcome:
        if refused := self._refused(f"reopen round={round_seen}"):
            return refused
        outcome = self.apply(lambda state: actions.reopen(state, round_seen))
        self.log(f"reopen round={round_seen}: {outcome.reason}")
        return outcome

    def replace_refused(self, raw: bytes) -> bool:
        """Writes a clean round over a state the decoder refused (only where the decoder is proven on this torch:
        the agents' own writes always decode, so a refused value is a stranger's or a bug's, and every agent that
        syncs would fail on it). Fenced by the bytes read; True when written."""
        with self.lock:
            last = max((r.round for r in self.tracker.rounds), default=0)
        fresh = encode(actions.clean(last + 1))
        with self._store_lock:
            written = self._store.compare_set(self.key, raw, fresh) == fresh
        if written:
            self.log(f"the rendezvous state could not be read: replaced with an open round {last + 1}")
        return written

    def stop(self, requested_at: float, margin: float) -> StopReply:
        """Writes a planned stop for the training's ranks (stop.py's rule picks the step); asked again with the
        same `requested_at`, answers with the step it picked then, unchanged."""
        name = stop.stop_id(requested_at)
        with self.lock:
            known = self.stop_record
            if known is not None and known["id"] == name:
                return StopReply(False, f"stop {name} is already asked: after step {known['step']}", step=known["step"])
            step = stop.agreed_step(self.progress.report, self.progress.received_at, self.now(), margin)
        if step is None:
            return StopReply(False, "no step and step time reported yet: no step to agree on")
        body = stop.record(requested_at, step, self.now())
        with self._store_lock:
            n = stop.next_number(self._store)
            self._store.set(stop.stop_key(n), body)
        with self.lock:
            self.stop_record = {"id": name, "step": step, "at": self.now()}
        self.log(f"stop {name}: every rank stops after step {step}")
        return StopReply(True, f"every rank stops after step {step}", step=step)

    def take_requests(self) -> None:
        """A worker's agent asked for a stop (stop.REQUEST_KEY grew: its pod is evicted or its node drained): the
        training stops and saves as for the operator's stop, unless the latest stop still applies to it."""
        with self._store_lock:
            count = stop.count(self._store, stop.REQUEST_KEY)
            if count is None:  # not a count: the agents' adds fail on it too; put back the last one taken
                self._store.set(stop.REQUEST_KEY, str(self._requests_seen).encode())
        # Any change is a request: a count moved back by a forged write must not hide the requests after it.
        if count is None or count == self._requests_seen:
            return
        self._requests_seen = count
        with self.lock:
            known, report = self.stop_record, self.progress.report
        if known is not None and stop.under_way(known["step"], report):
            self.log(f"a worker asked for a stop: stop {known['id']} (after step {known['step']}) applies")
            return
        reply = self.stop(self.now(), stop.REQUEST_MARGIN)
        if not reply.changed:
            self.log(f"a worker asked for a stop: {reply.reason}")

    def read_progress(self) -> None:
        with self._store_lock:
            raw = self._store.get(PROGRESS_KEY) if self._store.check([PROGRESS_KEY]) else b""
        with self.lock:
            self.progress.take(raw, self.now())

    def poll(self) -> None:
        """One poller tick: record a newly completed round and the training's progress, write the stop a worker's
        agent asked for, take out a waiter that did its job, and wake whoever waits for a change."""
        self.read_progress()
        self.take_requests()
        raw = self.read_raw()
        try:
            state = self._decode(raw)
        except StateError:
            if self.verdict.nudges and raw and self.replace_refused(raw):
                return
            raise
        now = self.now()
        reading = self._tables() if self._tables is not None else None
        self.silences.update(reading.unanswered if reading is not None else None, now)
        connected = reading.connected if reading is not None else None
        if self.remove_departed(state, now, connected):  # the seats below see the state without the agents gone
            raw = self.read_raw()
            state = self._decode(raw)
        with self.lock:
            completed = self.tracker.track(state, now)
        # After the round is noted, and at once when it is new: the reports of the processes it ended are dropped.
        self.read_pace(now, force=completed is not None)
        self.read_agents(state, now)
        self.read_seats(state, raw, now, connected)
        self.complete_seated(state, now)
        with self.lock:
            seen = (*summary(state, self.tracker, now, self.stale_after), self.progress.landmarks(now),
                    self.pace.landmark(now), self._gate_landmark(), self.node_checks.landmark(),
                    self.links.describe(), self.seats.landmark(), tuple(sorted(self.silences.silent(now))),
                    self.verdict)  # the verdict: a long poll wakes when the check ends
        if seen != self._summary:
            self._summary = seen
            with self.changed:
                self.version += 1
                self.changed.notify_all()
        if completed is not None:
            kind = "failure round" if completed.failure else "round"
            self.log(f"{kind} {completed.round} formed with {len(completed.nodes)} node(s): "
                     f"{', '.join(completed.nodes)}")
        if self.verdict.nudges and actions.has_waiter(state) and self._waiter_finished(state, now):
            outcome = self.apply(lambda current: actions.remove_waiter(current)
                                 if self._waiter_finished(current, now) else Outcome(None, False, "still needed"))
            if outcome.done:
                self.log(f"waiter removed (round now {state.round if state else None})")

    def _gate_landmark(self) -> tuple[Any, ...]:
        if self.gate is None:
            return ()
        report = self.gate()
        return report["told"], tuple(report["allowed"]), report["refused"]

    def remove_departed(self, state: RendezvousState | None, now: float, connected: set[str] | None) -> bool:
        """Nodes whose agent's connection closed are removed at once (peers.py), as the operator would remove
        them once the kubelet reports the pod's end. Whether any was. `connected`: None, the table unread."""
        if connected is None or state is None or not self.verdict.nudges:  # a write: after the verdict
            return False
        addresses = [n.addr for n in (*state.participants, *state.wait_list) if n != actions.WAITER]
        removed = False
        for addr in self._departures.gone(connected, addresses):
            outcome = self.apply(functools.partial(self._remove_gone, addr, self._utc(now)))
            removed = removed or outcome.done
            self.log(f"the agent at {addr} closed its connection: {outcome.reason}"
                     + (f" ({', '.join(map(repr, outcome.nodes))})" if outcome.nodes else ""))
        return removed

    def _remove_gone(self, addr: str, before: datetime, state: RendezvousState | None) -> Outcome:
        return actions.remove_node(state, addr, before, self.min_nodes, self._members(state))

    def _waiter_finished(self, state: RendezvousState | None, now: float) -> bool:
        with self.lock:
            waiter_round, added_at = self._waiter_round, self._waiter_added_at
        # A waiter no restart request of this process added (waiter_round None) has no purpose: take it out.
        return (state is not None and (waiter_round is None or state.round != waiter_round
                                       or now - added_at > WAITER_TTL))


def wait_for_change(control: Control, after: int, seconds: float) -> int:
    """Blocks until the summary's version passes `after`, at most `seconds`; returns the version."""
    with control.changed:
        control.changed.wait_for(lambda: control.version > after, timeout=seconds)
        return control.version


def start_poller(control: Control, stop: threading.Event, interval: float = POLL_INTERVAL) -> threading.Thread:
    """Polls until `stop` is set. Errors are logged once per distinct message, not four times a second."""

    def run() -> None:
        last_error = ""
        while not stop.wait(interval):
            try:
                control.poll()
                last_error = ""
            except Exception as err:  # the thread's top: a bad state or a store hiccup must not end polling
                message = f"{type(err).__name__}: {err}"
                if message != last_error:
                    control.log(f"poller: {message}")
                last_error = message

    thread = threading.Thread(target=run, name="rendezvous-poller", daemon=True)
    thread.start()
    return thread
