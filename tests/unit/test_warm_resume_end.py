"""An agent's end when its round was resumed on a store that came back (elasticjob_warm/resume.py's exit barrier).

torch's agent, once its workers succeed, waits for every agent of its round to count in on the round's store
(up to exit_barrier_timeout, 300 s). A peer that left while there was no store, that counted on the lost store, or
that was still away from the new one when its workers succeeded, never counts on the new one: without resume.py's
barrier the agent left on the new store sat there 300 s, and the job `Completing` with it. Each ordering below must end within END_SECONDS of the last workers' success; the normal
barrier must still hold an agent while its peer's workers run.

Two real torchrun agents (`python -m elasticjob_warm.torchrun`) on a real TCPStore server, which is killed and
started again at the same port; each agent's worker runs until its own stop file appears. The agents heartbeat
every second (torch's dead-node check: 3 s without one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from elasticjob_warm.resume import ARRIVED
from helpers import wait_for
from store_process import free_port_pair

RUN_ID = "end"
# The store's key for the count of torch's exit barrier in the first round (round 0).
COUNT_KEY = f"torch.rendezvous.{RUN_ID}.0/torchelastic/agent/terminal_state/num_members"
END_SECONDS = 20  # well under torch's 300 s, and well over torch's dead-node check (3 s here)
HELD_SECONDS = 7  # more than twice that check: a running peer is not taken for a gone one
SERVER = textwrap.dedent("""
    import sys, time, torch.distributed as d
    s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False, multi_tenant=True)
    print('up', flush=True)
    time.sleep(3600)
""")
WORKER = textwrap.dedent("""
    import os, sys, time
    out, me = sys.argv[1], os.environ["AGENT"]
    with open(os.path.join(out, "starts"), "a") as f:
        f.write(f"{os.getpid()} {me} {os.environ['RANK']}\\n")
    while not os.path.exists(os.path.join(out, f"stop{me}")):
        time.sleep(0.05)
""")


def start_store(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
    return proc


class Job:
    """Two agents (0 and 1: the test's names, not their ranks) and the store they share."""

    def __init__(self, out: Path) -> None:
        self.out, self.port = out, free_port_pair()  # below the kernel's own range: free again for the restart
        self.store = start_store(self.port)
        script = out / "worker.py"
        script.write_text(WORKER)
        self.agents: list[subprocess.Popen] = []
        for i in range(2):
            # As the operator sets it (elasticjob/torchrun.py): the workers do not share the rendezvous store.
            env = dict(os.environ, AGENT=str(i), PYTHONFAULTHANDLER="1", ELASTICJOB_WARM_PRELOAD="decimal",
                       LOGLEVEL="INFO", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
            with open(out / f"agent{i}.log", "w") as log:
                self.agents.append(subprocess.Popen(
                    [sys.executable, "-m", "elasticjob_warm.torchrun", "--nnodes=2:2", "--nproc-per-node=1",
                     "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id={RUN_ID}",
                     "--max-restarts=0",
                     "--rdzv-conf=is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,"
                     "read_timeout=30",
                     str(script), str(out)], env=env, stdout=log, stderr=log, start_new_session=True))

    def log(self, i: int) -> str:
        return (self.out / f"agent{i}.log").read_text()

    def logs(self) -> str:
        """Both logs' ends, without the C++ frames a store's errors print."""
        def tail(text: str) -> str:
            noise = ("frame #", "Exception raised from", "<omitting")
            return "\n".join(line for line in text.splitlines() if line and not line.startswith(noise))[-4000:]
        return "\n".join(f"--- agent {i}\n{tail(self.log(i))}" for i in range(2))

    def running(self) -> None:
        wait_for(lambda: len(self.starts()) == 2 or None, 90, "both agents' workers")

    def starts(self) -> list[list[str]]:
        path = self.out / "starts"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def finish(self, i: int) -> float:
        """Agent i's worker succeeds (within its 0.05 s poll): the time it was told to."""
        (self.out / f"stop{i}").touch()
        return time.monotonic()

    def kill_store(self, seen_by: tuple[int, ...] = ()) -> None:
        """The store killed, and seen gone by the agents `seen_by`."""
        self.store.kill()
        self.store.wait()
        for i in seen_by:
            self.seen(i, "stopped answering", "the store stopped answering", 15)

    def restart_store(self) -> None:
        self.store = start_store(self.port)

    def seen(self, i: int, text: str, what: str, timeout: float = 30) -> None:
        wait_for(lambda: text in self.log(i) or None, timeout, f"agent {i}'s log to say {what!r}")

    def ended(self, i: int, since: float) -> tuple[int, float]:
        """Agent i's exit status and the seconds from `since` to its exit, once it exits within END_SECONDS."""
        agent = self.agents[i]
        try:
            code = agent.wait(timeout=max(0.0, since + END_SECONDS - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent {i} still there {END_SECONDS} s after its workers succeeded:\n"
                                 f"{self.logs()}") from None
        return code, time.monotonic() - since

    def counted(self) -> int:
        """torch's exit-barrier count in the store now serving (0 before anyone counted)."""
        import torch.distributed as dist

        client = dist.TCPStore("127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=5))
        return int(client.add(COUNT_KEY, 0))

    def close(self) -> None:
        for i in range(2):
            (self.out / f"stop{i}").touch()
        for agent in self.agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGCONT)
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        if self.store.poll() is None:
            self.kill_store()


@pytest.fixture
def job(tmp_path: Path):
    job = Job(tmp_path)
    yield job
    job.close()


def stays(holds: Callable[[], Any], seconds: float, what: str, seen: Callable[[], str] = str) -> None:
    """Fails as soon as `holds()` is false within `seconds` (the opposite of wait_for), with what `seen()` says."""
    started = time.monotonic()
    while (into := time.monotonic() - started) < seconds:
        assert holds(), f"{what} ended {into:.1f} s into the {seconds:g} s it must last\n{seen()}"
        time.sleep(0.1)


def peer_left_during_the_outage(job: Job) -> None:
    """Agent 0's workers succeed while there is no store: its barrier fails on the lost store and it leaves;
    agent 1 resumes the round on the store that came back, alone."""
    job.kill_store(seen_by=(0, 1))
    assert job.ended(0, job.finish(0))[0] == 0, job.logs()
    job.restart_store()
    job.seen(1, "resumed on it", "its round resumed on the new store")


def peer_counted_on_the_lost_store(job: Job) -> None:
    """Agent 0's workers succeed first and it counts in on the store, which is then lost: its wait fails and it
    leaves; agent 1 resumes the round on the store that came back, where agent 0 never counted."""
    job.finish(0)
    wait_for(lambda: job.counted() == 1 or None, 15, "agent 0's count on the first store")
    job.kill_store(seen_by=(1,))
    assert job.ended(0, time.monotonic())[0] == 0, job.logs()
    job.restart_store()
    job.seen(1, "resumed on it", "its round resumed on the new store")


def peer_away_from_the_new_store(job: Job) -> None:
    """Agent 1 is away (stopped: no heartbeat, no reconnect) while agent 0 resumes the round on the store that
    came back and its workers succeed there: agent 1 never counts on it."""
    os.kill(job.agents[1].pid, signal.SIGSTOP)  # the agent alone: its worker trains on
    job.kill_store(seen_by=(0,))
    job.restart_store()
    job.seen(0, "resumed on it", "its round resumed on the new store")


@pytest.mark.parametrize("ordering", [peer_left_during_the_outage, peer_counted_on_the_lost_store,
                                      peer_away_from_the_new_store], ids=lambda f: f.__name__)
def test_an_agent_on_a_resumed_round_does_not_wait_at_its_end_for_a_peer_that_left(job, ordering):
    job.running()
    ordering(job)
    last = 0 if ordering is peer_away_from_the_new_store else 1
    code, took = job.ended(last, job.finish(last))
    assert code == 0, job.logs()
    assert "did not wait for" in job.log(last), job.logs()
    print(f"{ordering.__name__}: agent {last} ended {took:.1f} s after its workers' success")


def test_the_exit_barrier_still_holds_an_agent_while_its_peers_workers_run(job):
    """No outage: agent 0's workers succeed, agent 1's train on for longer than torch's dead-node check; agent 0
    waits for them, and both leave together once they succeed."""
    job.running()
    job.finish(0)
    wait_for(lambda: job.counted() == 1 or None, 15, "agent 0's count in the exit barrier")
    stays(lambda: job.agents[0].poll() is None, HELD_SECONDS, "agent 0's wait for agent 1's workers", job.logs)
    since = job.finish(1)
    for i in (0, 1):
        assert job.ended(i, since)[0] == 0, job.logs()
        assert "Done waiting for other agents" in job.log(i), job.logs()
        assert "did not wait for" not in job.log(i), job.logs()
        assert "Error waiting on exit barrier" not in job.log(i), job.logs()


# end_barrier itself, on a real TCPStore in this process; `present` stands for what torch's state says.
PREFIX = "torchelastic/agent/terminal_state"


@pytest.fixture
def store():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    return dist.PrefixStore(f"torch.rendezvous.{RUN_ID}.0", server)


def end(store, rank: int, world: int, present: Callable[[], set[int] | None], timeout: float = 5) -> list[int]:
    from elasticjob_warm.resume import end_barrier

    return end_barrier(store, rank, world, timeout, present, PREFIX)


def test_a_rank_gone_from_the_round_is_not_waited_for_once_every_other_one_is_at_its_end(store):
    started = time.monotonic()
    assert end(store, 0, 2, lambda: {0}) == [1]
    assert time.monotonic() - started < 1


def test_a_rank_that_counted_and_then_left_does_not_stand_in_for_one_still_running(store):
    """Three ranks: 2 counted and was then killed (gone from the round), 1 still runs. torch's count (2 of 3)
    is the round's size less the gone rank, yet rank 0 waits for rank 1 itself."""
    store.set(f"{PREFIX}/{ARRIVED}/2", b"")
    store.add(f"{PREFIX}/num_members", 1)
    waiting = _in_thread(lambda: end(store, 0, 3, lambda: {0, 1}))
    stays(lambda: not waiting.done(), 1.5, "rank 0's wait for rank 1, which runs")
    assert end(store, 1, 3, lambda: {0, 1}) == []  # the count complete: torch's barrier ends, and ours
    assert waiting.result(timeout=5) == []


def test_with_every_rank_in_the_round_or_nothing_known_the_count_decides(store):
    waiting = _in_thread(lambda: end(store, 0, 2, lambda: {0, 1}))
    stays(lambda: not waiting.done(), 1, "rank 0's wait for rank 1, which is in the round")
    assert end(store, 1, 2, lambda: None) == []
    assert waiting.result(timeout=5) == []
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] of 2"):
        end(type(store)("again", store), 0, 2, lambda: None, timeout=0.5)


def _in_thread(call: Callable[[], Any]) -> Any:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future
