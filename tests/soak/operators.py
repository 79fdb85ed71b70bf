"""The operator's replicas as the chart runs them: two processes with `--leader-elect` on one Lease (or one
process without, `--operators 1`), SIGKILLed at random moments and started again as the kubelet restarts a pod.

Each start is a new incarnation with its own log (operator-<replica>-<n>.log) and its own identity on the Lease.
A replica that exits by itself because it lost the Lease (exit 3, as designed: the kubelet restarts it) is
restarted and counted; any other exit is a crash.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

LEASE = "elasticjob-operator"
LEADER_SHARE = 0.75  # of the kills while a replica leads, the share that kill the leader (the failover)
LOST_LEASE_EXIT = 3  # elasticjob.controller.kopf_app.LOST_LEASE_EXIT
LOST_LEASE_LINE = "exiting: this replica lost the leader's Lease"
STARTED_LINE = "elasticjob operator started"
CANDIDATE = re.compile(r"leader election: candidate (\S+) for Lease")


@dataclass
class Incarnation:
    log: Path
    proc: subprocess.Popen
    # When the process ended, taken by a thread waiting on it: the leader's term ends there when its log says no
    # earlier (a SIGKILL or a crash leaves no line), even while the soak's loop is busy with a slow step.
    ended: datetime | None = None
    _waiter: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = datetime.now()

    def end(self) -> datetime | None:
        """When it ended, once it has (the waiter may trail a wait() of the soak's by a moment)."""
        if self.proc.poll() is not None and self._waiter is not None:
            self._waiter.join(timeout=5)
        return self.ended

    def identity(self) -> str | None:
        found = CANDIDATE.search(self.log.read_text(errors="replace"))
        return found.group(1) if found else None


@dataclass
class Replica:
    name: str
    incarnations: list[Incarnation] = field(default_factory=list)

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]


def choose(replicas: list[Replica], leader: Replica | None, roll: float, pick: int) -> Replica:
    """The replica to kill: the leader when `roll` (uniform in [0, 1)) is under LEADER_SHARE, else one of the others
    by `pick`. Both are drawn whatever leads, so that a seed draws the same numbers in the same order."""
    others = [r for r in replicas if r is not leader]
    if leader is not None and (not others or roll < LEADER_SHARE):
        return leader
    return others[pick % len(others)]


class Operators:
    def __init__(self, root: Path, kubeconfig: Path, namespace: str, logs: Path, api: client.ApiClient | None,
                 replicas: int = 2):
        self.root, self.kubeconfig, self.namespace, self.logs = root, kubeconfig, namespace, logs
        self.leases = client.CoordinationV1Api(api) if api is not None else None
        self.elect = replicas > 1
        self.replicas = [Replica("abcdefgh"[i]) for i in range(replicas)]
        self.counts: Counter[str] = Counter()
        self.crashes: list[str] = []

    def start(self) -> None:
        for replica in self.replicas:
            self._start(replica)

    def _start(self, replica: Replica) -> None:
        key = self.logs / "rendezvous.key"
        if not key.exists():
            key.write_text(os.urandom(16).hex())
        path = self.logs / f"operator-{replica.name}-{len(replica.incarnations)}.log"
        # The Lease lives in the watched namespace, found as in the chart's pods (POD_NAMESPACE).
        elect = ["--leader-elect", "--leader-lease-name", LEASE] if self.elect else []
        with open(path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "elasticjob", "run", "-n", self.namespace, "--rendezvous-key-file", str(key),
                 *elect],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True,
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1",
                     "POD_NAMESPACE": self.namespace})
        replica.incarnations.append(Incarnation(path, proc))

    def check_alive(self) -> None:
        """Restart each replica whose process has exited by itself, as the kubelet would."""
        for replica in self.replicas:
            current = replica.current
            if current.proc.poll() is None:
                continue
            code = current.proc.returncode
            if self.elect and code == LOST_LEASE_EXIT and LOST_LEASE_LINE in current.log.read_text(errors="replace"):
                self.counts["operator restarts after losing the Lease"] += 1
            else:
                self.crashes.append(f"{current.log.name} exited by itself with {code}")
            self._start(replica)

    def leader(self) -> Replica | None:
        """The replica whose live incarnation holds the Lease, as the API server has it; None when the holder is
        gone (killed, its Lease not yet taken), or the API server cannot say."""
        if not self.elect:
            return self.replicas[0]
        try:
            holder = self.leases.read_namespaced_lease(LEASE, self.namespace, _request_timeout=5).spec.holder_identity
        except (ApiException, urllib3.exceptions.HTTPError, OSError):  # e.g. the API server restarting
            return None
        return next((r for r in self.replicas if holder and r.current.identity() == holder), None)

    def kill(self, rng: random.Random) -> None:
        """SIGKILL one replica and start it again: the leader, mostly, while one leads; else either."""
        self.check_alive()
        leader = self.leader()
        victim = choose(self.replicas, leader, rng.random(), rng.randrange(len(self.replicas)))
        current = victim.current
        os.killpg(current.proc.pid, signal.SIGKILL)
        current.proc.wait()
        self.counts["operator SIGKILLs"] += 1
        if self.elect and victim is leader:
            self.counts["operator SIGKILLs of the leader"] += 1
        self._start(victim)

    def stop(self) -> list[int]:
        """SIGTERM every replica, the leader last (stopping it first would hand the Lease to one about to stop).
        Each once started: one SIGKILLed a moment before the churn ended may still be importing, and Python's
        default for SIGTERM is to die of it, which says nothing about us."""
        self.check_alive()  # one that exited by itself meanwhile is counted as such, not as a failed stop
        leader = self.leader() if self.elect else None
        return [self._stop(r.current) for r in sorted(self.replicas, key=lambda r: r is leader)]

    def _stop(self, current: Incarnation) -> int:
        deadline = time.monotonic() + 60
        while current.proc.poll() is None and time.monotonic() < deadline:
            if STARTED_LINE in current.log.read_text(errors="replace"):
                break
            time.sleep(0.2)
        current.proc.send_signal(signal.SIGTERM)
        try:
            code = current.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(current.proc.pid, signal.SIGKILL)
            current.proc.wait()
            code = -9
        return code

    def incarnations(self) -> list[tuple[str, str, datetime]]:
        """(log name, log text, when it ended) of every incarnation that has ended, replica by replica."""
        return [(i.log.name, i.log.read_text(errors="replace"), ended)
                for r in self.replicas for i in r.incarnations if (ended := i.end()) is not None]

    def logs_text(self) -> list[tuple[str, str]]:
        """(file name, text) of every incarnation's log, replica by replica, in the order they ran."""
        return [(i.log.name, i.log.read_text(errors="replace")) for r in self.replicas for i in r.incarnations]
