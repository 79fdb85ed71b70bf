"""SIGTERM to a worker pod's agent (an eviction, a node drain): the training stops at a step all ranks agree on
and saves it before torchrun stops the workers (elasticjob_warm/evicted.py, elasticjob_store/stop.py).

The decisions are table-tested; the signal path runs real processes: the store (`python -m elasticjob_store`),
the agent (`python -m elasticjob_warm.torchrun`, two ranks on the store's c10d rendezvous) and a training that
asks elasticjob_progress's should_stop(). Seconds, not milliseconds: every process imports torch.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elasticjob_store import stop as store_stop
from elasticjob_warm import evicted
from elasticjob_warm.evicted import Next
from helpers import wait_for
from store_process import start_store_process

LISTENING = {"listens": True, "step": 40, "stepSeconds": 0.05, "firstStep": 1}


@pytest.mark.parametrize("report, latest, grace, expected", [
    (LISTENING, None, 30, Next.ASK),
    (LISTENING, ("1.000", 30), 30, Next.ASK),  # an older stop, for a process before this one
    ({**LISTENING, "stopped": {"step": 30, "at": 1.0}}, ("1.000", 30), 30, Next.DONE),  # the operator's, saved
    ({**LISTENING, "stopped": {"step": 30, "at": 1.0}}, ("2.000", 44), 30, Next.ASK),  # another stop since
    (LISTENING, None, 0, Next.GO),  # stopGraceSeconds 0: as today
    ({**LISTENING, "listens": False}, None, 30, Next.GO),  # the script never asks should_stop
    ({**LISTENING, "step": None}, None, 30, Next.GO),  # nothing stepped yet: nothing to save
    ({**LISTENING, "stepSeconds": None}, None, 30, Next.GO),  # no step time: the store could not pick a step
    (None, None, 30, Next.GO),  # no report at all
])
def test_what_sigterm_starts(report, latest, grace, expected):
    assert evicted.first_look(report, latest, grace) == expected


@pytest.mark.parametrize("stop_step, report, expected", [
    (50, {"firstStep": 1, "step": 45}, True),  # the training is on its way to the stop
    (50, {"firstStep": 1, "step": 50}, True),  # it stopped there and holds
    (50, {"firstStep": 1, "step": 51}, False),  # it stepped past it: a stop of another process
    (50, {"firstStep": 51, "step": 52}, False),  # a process that began after it
    (50, {"firstStep": None, "step": None}, False),  # a process that has not stepped yet
    (None, {"firstStep": 1, "step": 45}, False),  # no stop yet
    (50, None, False),
])
def test_a_workers_request_reuses_a_stop_under_way(stop_step, report, expected):
    assert store_stop.under_way(stop_step, report) is expected


def test_the_keys_are_the_stores():
    assert (evicted.REQUEST_KEY, evicted.COUNT_KEY, evicted.STOP_PREFIX) == (
        store_stop.REQUEST_KEY, store_stop.COUNT_KEY, store_stop.STOP_PREFIX)


@pytest.mark.parametrize("environ, grace", [({}, 0.0), ({"ELASTICJOB_STOP_GRACE_SECONDS": "45"}, 45.0),
                                            ({"ELASTICJOB_STOP_GRACE_SECONDS": "-1"}, 0.0)])
def test_the_grace_comes_from_the_operator(environ, grace):
    assert evicted.grace_seconds(environ) == grace


TRAINING = textwrap.dedent("""
    import json, os, sys, time
    import elasticjob_progress
    out, listen = sys.argv[1], sys.argv[2] == "listen"
    rank = os.environ["RANK"]
    progress = elasticjob_progress.Progress(interval=0.1)
    def note(record):
        with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\\n")
    for n in range(1, 100000):
        time.sleep(0.05)
        progress.step(n)
        note({"step": n})
        if listen and progress.should_stop(n):
            progress.saved(n)
            note({"stopped": n})
            progress.stopped(n)  # holds the process until torchrun ends it
""")


@pytest.fixture
def store(tmp_path):
    env = {**os.environ, "ELASTICJOB_RDZV_RUN_ID": "evicted", "ELASTICJOB_RDZV_MIN_NODES": "1",
           "ELASTICJOB_RDZV_MAX_NODES": "1"}

    def ready(port):
        try:
            return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=2))
        except dist.DistNetworkError:
            return None  # not listening yet: a loaded machine can take longer than 2 s to import torch

    proc, port = start_store_process([sys.executable, "-m", "elasticjob_store"], env, tmp_path / "store.log",
                                     ready, start_new_session=True)
    yield port
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def agent(tmp_path, port: int, mode: str, grace: str) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    endpoint = f"127.0.0.1:{port}"
    env = {**os.environ, "PET_RDZV_ENDPOINT": endpoint, "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1",
           "ELASTICJOB_STOP_GRACE_SECONDS": grace, "ELASTICJOB_WARM_SOCKET": str(tmp_path / "warm.sock"),
           "ELASTICJOB_WARM_PRELOAD": "decimal"}
    with open(tmp_path / "agent.log", "w") as log:  # the warm server keeps the agent's stderr: not a pipe
        return subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--nproc-per-node=2",
                                 "--max-restarts=0", str(script), str(tmp_path), mode], env=env, stdout=log,
                                stderr=log, start_new_session=True)


def records(tmp_path, rank: int) -> list[dict]:
    path = tmp_path / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def terminate_when_stepping(tmp_path, proc: subprocess.Popen, port: int | None = None) -> float:
    """SIGTERM to the agent, as the kubelet sends it on an eviction, once both ranks stepped and (with the store's
    port) rank 0's report that it listens reached the store (reports go once a second: on a loaded machine 30
    steps came before the first); returns when."""
    def stepping():
        assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
        return [len(records(tmp_path, rank)) for rank in (0, 1)]

    wait_for(stepping, 90, "both ranks stepping", until=lambda counts: min(counts) >= 30)
    if port is not None:
        view = evicted.StoreView(dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5)))
        wait_for(view.report, 60, "rank 0's report that it listens in the store",
                 until=lambda report: evicted.first_look(report, None, 30.0) == evicted.Next.ASK)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    return sent


def finish(tmp_path, proc: subprocess.Popen, timeout: float) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return (tmp_path / "agent.log").read_text()


def test_sigterm_has_every_rank_save_one_agreed_step_before_the_workers_stop(tmp_path, store):
    proc = agent(tmp_path, store, "listen", "30")
    terminate_when_stepping(tmp_path, proc, store)
    log = finish(tmp_path, proc, 60)
    stops = [[r["stopped"] for r in records(tmp_path, rank) if "stopped" in r] for rank in (0, 1)]
    assert stops[0] and stops[0] == stops[1], f"the ranks did not stop at one step: {stops}\n{log[-3000:]}"
    (step,) = stops[0]
    steps = [max(r["step"] for r in records(tmp_path, rank) if "step" in r) for rank in (0, 1)]
    assert steps == [step, step], f"a rank stepped past the agreed stop {step}: {steps}"
    assert "asked the training to stop" in log and f"every rank saved step {step}" in log, log[-3000:]
    assert f"every rank stops after step {step}" in (tmp_path / "store.log").read_text()


def test_sigterm_to_a_training_that_does_not_listen_stops_the_workers_at_once(tmp_path, store):
    proc = agent(tmp_path, store, "deaf", "30")
    sent = terminate_when_stepping(tmp_path, proc)
    log = finish(tmp_path, proc, 60)
    assert time.monotonic() - sent < 20, "the agent waited for a training that never listens"
    assert "asked the training to stop" not in log, log[-3000:]
    client = dist.TCPStore("127.0.0.1", store, is_master=False, timeout=timedelta(seconds=5))
    assert int(client.add(store_stop.REQUEST_KEY, 0)) == 0


class Policy:
    """The job's network policy in front of the store, as a TCP relay: once the pod is gone from the API
    (`forget`), the connections it has keep working and new ones are dropped (the accept queue stays full), as
    measured for a pod deleted with grace 0."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while self.open:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                near.close()
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def forget(self) -> None:
        self.open = False
        self.listener.listen(0)
        self.held.append(socket.create_connection(("127.0.0.1", self.port)))  # wakes accept(), which returns
        self.thread.join(timeout=10)
        self.held.append(socket.create_connection(("127.0.0.1", self.port)))  # fills the queue: none accepts it
        assert self._dropped(), "a new connection got through"

    def _dropped(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
        except OSError:
            return True
        return False


def test_sigterm_after_a_deletion_at_once_stops_the_workers_before_the_kubelets_kill(tmp_path, store):
    """A pod deleted with grace 0 gets SIGTERM and, 2 s later, SIGKILL; its new connections to the store are
    dropped from the deletion on. The agent gives the store up at once and lets torchrun stop the workers well
    inside those 2 s (a TCPStore client waited 3 s for it while they trained on, steps done again after)."""
    policy = Policy(store)
    proc = agent(tmp_path, policy.port, "listen", "30")
    wait_for(lambda: min(len(records(tmp_path, rank)) for rank in (0, 1)), 90, "both ranks stepping",
             until=lambda steps: steps >= 30)
    policy.forget()
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    log = finish(tmp_path, proc, 60)
    assert "no stop asked" in log, log[-3000:]
    last = max(os.path.getmtime(tmp_path / f"rank{rank}.jsonl") for rank in (0, 1))
    assert last - sent < 2.0, f"the workers stepped {last - sent:.1f}s after SIGTERM: past the kubelet's kill"
