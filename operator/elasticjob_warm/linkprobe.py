"""The link probe: once a round has formed, its agents measure the link between every pair of them.

A sick NIC (a bad cable, a flapping port, a link negotiated down) slows every collective of the job and fails
nothing. Right after a round forms, before the workers start, the round's agents (one per node) probe their links
over gloo on TCP, in a round-robin tournament: every pair is measured, no agent is in two transfers at once. A
pair exchanges `pings` one-element ping-pongs (latency: their median round trip) and a `size_bytes` tensor each
way (bandwidth: the slower direction). The tournament runs SWEEPS times and each link keeps its best figures: on
a loaded host a burst of scheduling delay slows one sweep, a sick NIC every one.

Each agent writes its row under the round's store; rank 0 reads them all, names the outlier (the agent whose
links are all slow: outlier()) and publishes the report under REPORT_KEY, which the store checks
(elasticjob_store/links.py).
Each agent logs one line, `elasticjob_warm.torchrun: link probe ...`; a failed probe never stops training (run()
logs why, naming the peer to blame, and returns None). ELASTICJOB_LINK_PROBE_SECONDS (default 10) bounds it all.
The gloo group is made directly, not with init_process_group: the default group stays unset for the user's script.

ELASTICJOB_LINK_PROBE_FAULT is a fault-injection hook for tests, never set by the operator: `slow` makes this
agent sleep SLOW_SECONDS before every send and receive of the probe, so that all its links look slow; `crash`
SIGKILLs it at its first send or receive (an agent that dies mid-probe), `hang` sleeps an hour there instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from elasticjob_store.links import (
    MAX_MBPS,
    MAX_MICROSECONDS,
    MAX_REASON,
    MIN_AGENTS,
    REPORT_KEY,
    SUMMARY_RANKS,
    VERSION,
)
from elasticjob_warm import polling

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Store, Work

SECONDS_ENV = "ELASTICJOB_LINK_PROBE_SECONDS"
FAULT_ENV = "ELASTICJOB_LINK_PROBE_FAULT"
FACTOR_ENV = "ELASTICJOB_LINK_PROBE_FACTOR"
FAULTS = ("slow", "crash", "hang")
DEFAULT_SECONDS = 10.0
SLOW_SECONDS = 0.02
SWEEPS = 5  # 3 let a healthy rank look 2.9x slow on a 2-core host under load; 5, 1.6x at most
GROUP_PREFIX = "elasticjob.linkprobe"  # the gloo group's own keys, under the round's store
FACTOR = 3.0
MARGIN = 0.005  # seconds: see outlier()
MIB = 1 << 20
LINE = "elasticjob_warm.torchrun: link probe "


class Failed(Exception):
    """The probe could not measure; the message names the peer to blame where there is one."""


def key(kind: str, rank: int) -> str:
    """The probe's keys in the round's store: `came`, `row` (its links as JSON) and `failed` (why it gave up)."""
    return f"{GROUP_PREFIX}.{kind}/{rank}"


def schedule(world: int) -> list[dict[int, int]]:
    """Each turn's pairs, as rank -> peer, by the circle method: rank n-1 stays where it is, the others rotate;
    an odd world gets a phantom rank `world`, and whoever meets it sits that turn out."""
    n = world + world % 2
    turns = []
    for turn in range(n - 1):
        pairs = [(turn, n - 1)] + [((turn + k) % (n - 1), (turn - k) % (n - 1)) for k in range(1, n // 2)]
        turns.append({a: b for pair in pairs if max(pair) < world for a, b in (pair, pair[::-1])})
    return turns


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:160] if lines else 'no message'}"


class Probe:
    """One agent's side, over a gloo group, each operation bounded by the probe's deadline."""

    def __init__(self, group: Any, store: Store, rank: int, deadline: float, size_bytes: int,
                 fault: str | None) -> None:
        import torch

        self.group: Any = group  # a ProcessGroupGloo: its send and recv are not in torch's stubs
        self.store, self.rank, self.deadline, self.fault = store, rank, deadline, fault
        self.small = torch.zeros(1, dtype=torch.float32)  # a ping or an ack
        self.big = torch.zeros(size_bytes, dtype=torch.uint8)
        self.samples: dict[int, list[tuple[float, float]]] = {}  # peer -> each sweep's (round trip, send)

    def op(self, sending: bool, tensor: torch.Tensor, peer: int, what: str) -> None:
        if self.fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "slow":
            time.sleep(SLOW_SECONDS)
        self.wait(self.post(sending, tensor, peer, what), peer, what)

    def post(self, sending: bool, tensor: torch.Tensor, peer: int, what: str) -> Work:
        """A send or a receive, blamed on the peer where gloo refuses it at once (its pair closed already: seen
        when a peer died mid-probe, which then went unnamed)."""
        try:
            work: Work = (self.group.send if sending else self.group.recv)([tensor], peer, 0)
        except Exception as error:  # noqa: BLE001 - gloo's errors: a peer gone, a reset
            raise self.blame(peer, f"the {what} with rank {peer} failed: {one_line(error)}") from None
        return work

    def wait(self, work: Work, peer: int, what: str) -> None:
        try:
            if not work.wait(timedelta(seconds=max(0.001, self.deadline - time.monotonic()))):
                raise RuntimeError("timed out")
        except Exception as error:  # noqa: BLE001 - gloo's errors: a peer gone, a reset, a timeout
            raise self.blame(peer, f"the {what} with rank {peer} failed: {one_line(error)}") from None

    def blame(self, peer: int, failure: str) -> Failed:
        """Failed, saying why the peer gave up where it did first (its group then closed on this rank)."""
        with contextlib.suppress(Exception):
            if self.store.check([key("failed", peer)]):
                return Failed(f"rank {peer} gave up first: {self.store.get(key('failed', peer)).decode()}")
        return Failed(failure)

    def ping(self, peer: int, first: bool) -> float:
        """The round trip of one small tensor (the pair's first rank's figure: the other's starts waiting)."""
        began = time.monotonic()
        self.op(first, self.small, peer, "ping")
        self.op(not first, self.small, peer, "ping")
        return time.monotonic() - began

    def one_way(self, peer: int, sending: bool) -> float:
        """The big tensor, timed by its sender until the receiver's ack is back. The ack's round trip is not
        subtracted: the difference of two noisy times can come out near zero, or below."""
        began = time.monotonic()
        self.op(sending, self.big, peer, "transfer")
        self.op(not sending, self.small, peer, "transfer's ack")
        return time.monotonic() - began

    def sample(self, peer: int, pings: int) -> None:
        """One sweep's figures for the link: its round trip (the first rank's) and this side's send."""
        first = self.rank < peer
        self.ping(peer, first)  # not counted: it waits for the peer to be done with its previous pair
        rtt = statistics.median([self.ping(peer, first) for _ in range(pings)])
        out, back = self.one_way(peer, sending=first), self.one_way(peer, sending=not first)
        self.samples.setdefault(peer, []).append((rtt if first else math.inf, out if first else back))

    def links(self) -> dict[int, dict[str, float]]:
        """Each link's best figures over the sweeps, agreed with its peer: the first rank's latency and the
        slower direction's bandwidth (a ring all-reduce runs at its slowest hop; a NIC can be sick one way)."""
        import torch

        if self.fault == "slow":
            time.sleep(2 * SLOW_SECONDS)
        mine = {peer: torch.tensor([min(s[0] for s in got), min(s[1] for s in got)], dtype=torch.float64)
                for peer, got in self.samples.items()}
        theirs = {peer: torch.zeros(2, dtype=torch.float64) for peer in mine}
        works = [(peer, self.post(True, mine[peer], peer, "exchange of figures"),
                  self.post(False, theirs[peer], peer, "exchange of figures"))
                 for peer in mine]  # all posted at once: no pair waits on another
        for peer, sent, received in works:
            self.wait(sent, peer, "exchange of figures")
            self.wait(received, peer, "exchange of figures")
        return {peer: {"latency": float(min(mine[peer][0], theirs[peer][0])),
                       "bandwidth": self.big.numel() / max(float(mine[peer][1]), float(theirs[peer][1]), 1e-9)}
                for peer in mine}


def await_ranks(store: Store, kind: str, world: int, deadline: float) -> None:
    """Waits for every rank's `kind` key (came, row); raises Failed naming the ranks missing at the deadline."""
    keys = [key(kind, peer) for peer in range(world)]
    try:
        store.wait(keys, timedelta(seconds=max(0.001, deadline - time.monotonic())))
        return
    except Exception as error:  # noqa: BLE001 - the store's timeout, or the store itself gone
        cause = one_line(error)
    missing: list[int] = []
    with contextlib.suppress(Exception):
        missing = [peer for peer in range(world) if not store.check([keys[peer]])]
    ranks = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
    missed = "did not come to the probe" if kind == "came" else f"wrote no {kind}"
    raise Failed(f"rank {ranks} {missed}" if missing else f"the store failed: {cause}")


def sweeps(store: Store, rank: int, world: int, deadline: float, size_bytes: int, pings: int,
           fault: str | None) -> dict[int, dict[str, float]]:
    from torch.distributed import distributed_c10d as c10d

    try:
        group = c10d.ProcessGroupGloo(c10d.PrefixStore(GROUP_PREFIX, store), rank, world,
                                      timedelta(seconds=max(0.001, deadline - time.monotonic())))
    except Exception as error:  # noqa: BLE001 - gloo's connect: a peer gone since it came
        raise Failed(f"the gloo group did not form: {one_line(error)}") from None
    try:
        probe = Probe(group, store, rank, deadline, size_bytes, fault)
        for _ in range(SWEEPS):
            for peers in schedule(world):
                if rank in peers:
                    probe.sample(peers[rank], pings)
        return probe.links()
    except Failed as failure:
        with contextlib.suppress(Exception):  # before the group closes: a peer it leaves can say why
            store.set(key("failed", rank), str(failure)[:MAX_REASON])
        raise
    finally:
        group.shutdown()  # its threads end; the next round makes a new group


def measure(store: Store, rank: int, world: int, *, size_bytes: int = 1 << 20, pings: int = 5,
            timeout: float = 5.0, fault: str | None = None) -> dict[str, Any]:
    """This rank's row: its link to each other rank, within `timeout` seconds from here (the others' arrival
    included). `fault` is FAULT_ENV's value (tests only). Raises Failed."""
    began = time.monotonic()
    links: dict[int, dict[str, float]] = {}
    if world > 1:
        store.set(key("came", rank), "1")
        await_ranks(store, "came", world, began + timeout)
        links = sweeps(store, rank, world, began + timeout, size_bytes, pings, fault)
    return {"rank": rank, "world": world, "links": links, "seconds": time.monotonic() - began}


def figures(row: Any) -> tuple[int, float, float] | None:
    """(rank, its best link's bandwidth, its best link's latency), or None for a row that is not one."""
    try:
        rank, links = row["rank"], list(row["links"].values())
        bandwidths = [float(link["bandwidth"]) for link in links]
        latencies = [float(link["latency"]) for link in links]
    except (TypeError, KeyError, AttributeError, ValueError):
        return None
    if type(rank) is not int or not links or not all(math.isfinite(v) and v > 0 for v in bandwidths + latencies):
        return None
    return rank, max(bandwidths), min(latencies)


def outlier(rows: list[dict[str, Any]], factor: float = FACTOR, margin: float = MARGIN) -> tuple[int, str] | None:
    """The rank whose links are all slow: its best link's bandwidth under the median rank's / factor, or its
    best latency over factor x the median rank's, and worse by `margin` seconds too (its round trip, or its time
    for each MiB). The worst such rank and why, else None. Malformed rows, and a rank's rows after its first,
    are ignored.

    A rank's best link, not its median one: a sick NIC slows all its links while a healthy agent keeps fast
    ones, and in a world of 3 the median of a rank's two links is their mean, half of it the sick peer's.
    The margin: below it, a loaded host's scheduler (4 ms ticks) makes the difference, not the NIC; so a NIC
    down to 1 Gb/s among fast ones stands out, one down from 100 to 25 Gb/s does not.
    Under 3 ranks there is no outlier: a pair's one slow link cannot say which end is slow."""
    seen: dict[int, tuple[float, float]] = {}
    for found in map(figures, rows):
        if found is not None:
            seen.setdefault(found[0], found[1:])
    if len(seen) < MIN_AGENTS:
        return None
    mid_bw = statistics.median(bw for bw, _ in seen.values())
    mid_lat = statistics.median(lat for _, lat in seen.values())

    def worse(rank: int) -> float:  # how many times the median rank's figure, where the margin is passed too
        bw, lat = seen[rank]
        by_bw = mid_bw / bw if (1 / bw - 1 / mid_bw) * MIB >= margin else 0.0
        return max(by_bw, lat / mid_lat if lat - mid_lat >= margin else 0.0)

    worst = max(seen, key=worse)
    if worse(worst) <= factor:
        return None
    bw, lat = seen[worst]
    return worst, (f"rank {worst}'s best link: {bw / 1e6:.1f} MB/s, {lat * 1e3:.2f} ms round trip; the median "
                   f"rank's: {mid_bw / 1e6:.1f} MB/s, {mid_lat * 1e3:.2f} ms")


def verdict(rows: list[dict[str, Any]], world: int, factor: float = FACTOR) -> dict[str, Any]:
    """The report rank 0 publishes: the outlier, the probe's seconds (its slowest rank's) and each rank's best
    figures (the first SUMMARY_RANKS ranks; null without a row), each bounded as the store checks them
    (elasticjob_store/links.py)."""
    named = outlier(rows, factor)
    best = {found[0]: found for found in map(figures, rows) if found is not None}
    shown = range(min(world, SUMMARY_RANKS))
    return {"v": VERSION, "world": world,
            "seconds": round(min(3600.0, max((float(row["seconds"]) for row in rows), default=0.0)), 3),
            "outlier": named[0] if named else None, "reason": named[1][:MAX_REASON] if named else None,
            "bandwidthMBps": [min(MAX_MBPS, round(best[r][1] / 1e6)) if r in best else None for r in shown],
            "latencyUs": [min(MAX_MICROSECONDS, round(best[r][2] * 1e6)) if r in best else None for r in shown]}


def read_rows(store: Store, world: int, deadline: float) -> list[dict[str, Any]]:
    """Each rank's row, as JSON gives it back (peers' ranks as strings); one that is not a row is left out."""
    await_ranks(store, "row", world, deadline)
    rows = []
    for peer in range(world):
        with contextlib.suppress(ValueError, RecursionError):  # outlier() checks the figures
            row = json.loads(store.get(key("row", peer)))
            if isinstance(row, dict) and row.get("v") == VERSION and row.get("rank") == peer and type(
                    row.get("seconds")) in (int, float) and 0 <= row["seconds"] <= 3600:
                rows.append(row)
    return rows


def settings(environ: Mapping[str, str]) -> tuple[float, str | None, float]:
    """The probe's budget in seconds, its fault (tests only) and the outlier's factor (the operator's
    spec.nodeCheck.linkFactor); ValueError for a value that is none of these."""
    seconds = polling.bounded_seconds(SECONDS_ENV, environ.get(SECONDS_ENV) or str(DEFAULT_SECONDS), 600)
    fault = environ.get(FAULT_ENV) or None
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={fault!r}: a fault-injection hook for tests, one of {', '.join(FAULTS)}")
    try:
        factor = float(environ.get(FACTOR_ENV) or FACTOR)
    except ValueError:
        factor = math.nan
    if not 1.5 <= factor <= 100:
        raise ValueError(f"{FACTOR_ENV}={environ.get(FACTOR_ENV)!r}: expected a number from 1.5 to 100")
    return seconds, fault, factor


def run(store: Store, rank: int, world: int, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The probe as the agent runs it, on the round's store: rank 0 returns the report it published, another
    rank its own row. Never raises: on any failure it logs why and returns None (training goes on)."""
    try:
        seconds, fault, factor = settings(environ)
        deadline = time.monotonic() + seconds
        row = measure(store, rank, world, timeout=seconds, fault=fault)
        store.set(key("row", rank), json.dumps({"v": VERSION, **row}, separators=(",", ":")))
        if rank != 0:
            log(f"done in {row['seconds']:.2f} s (rank {rank} of {world}; rank 0 reports)")
            return row
        report = verdict(read_rows(store, world, deadline), world, factor)
        store.set(REPORT_KEY, json.dumps(report, separators=(",", ":")))
        found = f"outlier rank {report['outlier']}: {report['reason']}" if report["reason"] else "no outlier"
        log(f"of {world} agents in {report['seconds']:.2f} s: {found}")
        return report
    except Exception as error:  # noqa: BLE001 - a failed probe must never stop training
        log(f"failed (training goes on): {error if isinstance(error, Failed) else one_line(error)}")
        return None


def log(text: str) -> None:
    print(LINE + text, file=sys.stderr, flush=True)
