"""A lost store costs the agents nothing: their round is resumed on the store that came back (elasticjob_warm/outage.py,
resume.py), or, where it cannot be, they restart their workers in place. Two real torchrun agents
(`python -m elasticjob_warm.torchrun`) on a real TCPStore server, which is killed and started again at the same
port. Seconds, not milliseconds: each agent imports torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from elasticjob_warm.outage import Outage
from helpers import wait_for
from store_process import free_port_pair

RUN_ID = "outage"
SERVER = textwrap.dedent("""
    import base64, pickle, sys, time, torch.distributed as d
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState
    s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False, multi_tenant=True)
    if len(sys.argv) > 2:  # a round already there, as if written before any agent was back
        state = _RendezvousState()
        state.round = int(sys.argv[2])
        s.set(f"torch.rendezvous.{sys.argv[3]}", base64.b64encode(pickle.dumps(state)))
    print('up', flush=True)
    time.sleep(3600)
""")
WORKER = textwrap.dedent("""
    import os, sys, time
    out = sys.argv[1]
    with open(os.path.join(out, "starts"), "a") as f:
        f.write(f"{os.getpid()} {os.environ['RANK']} {os.environ['WORLD_SIZE']}\\n")
    while not os.path.exists(os.path.join(out, "stop")):
        time.sleep(0.05)
""")



def start_store(port: int, seed_round: int | None = None) -> subprocess.Popen:
    seed = [] if seed_round is None else [str(seed_round), RUN_ID]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), *seed], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout.readline().strip() == b"up"
    return proc


def starts(out: Path) -> list[list[str]]:
    path = out / "starts"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def job(tmp_path, request):
    nnodes, last_call = getattr(request, "param", ("2:2", 1))
    port = free_port_pair()  # below the kernel's own range: free again when the store restarts on it
    store = start_store(port)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # As the operator sets it (elasticjob/torchrun.py): the workers do not share the rendezvous store.
    env = dict(os.environ, PYTHONFAULTHANDLER="1", ELASTICJOB_WARM_PRELOAD="decimal", LOGLEVEL="INFO", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    agents = []
    for i in range(2):
        log = open(tmp_path / f"agent{i}.log", "w")
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "elasticjob_warm.torchrun", f"--nnodes={nnodes}", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={RUN_ID}", "--max-restarts=0",
             f"--rdzv-conf=is_host=false,last_call_timeout={last_call},keep_alive_interval=1,read_timeout=30",
             str(script), str(tmp_path)], env=env, stdout=log, stderr=log, start_new_session=True))
    state = {"store": store, "port": port, "agents": agents, "out": tmp_path}
    yield state
    (tmp_path / "stop").touch()
    for proc in [*agents, state["store"]]:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL) if proc in agents else proc.kill()
            proc.wait()


def logs(out: Path) -> str:
    return "\n".join((out / f"agent{i}.log").read_text() for i in range(2))


def test_the_agents_ride_out_a_lost_store_and_their_workers_train_on_in_the_round_resumed_there(job):
    out, agents = job["out"], job["agents"]
    first = wait_for(lambda: starts(out) if len(starts(out)) == 2 else None, 90, "the first round's workers")
    job["store"].kill()
    job["store"].wait()
    wait_for(lambda: logs(out).count("stopped answering") == 2 or None, 15, "both agents to see the store go")
    assert all(a.poll() is None for a in agents), logs(out)[-3000:]
    job["store"] = start_store(job["port"])
    wait_for(lambda: logs(out).count("resumed on it, the workers train on") == 2 or None, 30,
             "both agents to resume their round on the store that came back")
    held = stored_round(job["port"])
    assert held.complete and held.round == 0 and sorted(held.participants.values()) == [0, 1], vars(held)
    assert all(a.poll() is None for a in agents), f"an agent left with the store:\n{logs(out)[-3000:]}"
    for pid, _, _ in first:  # the first round's workers never stopped
        os.kill(int(pid), 0)
    (out / "stop").touch()
    codes = [a.wait(timeout=60) for a in agents]
    assert codes == [0, 0], logs(out)[-3000:]
    assert len(starts(out)) == 2, starts(out)
    # Their ends met on the new store, under the resumed round's prefix (not the lost store's client).
    assert "Error waiting on exit barrier" not in logs(out), logs(out)[-3000:]
    assert logs(out).count("Done waiting for other agents") == 2, logs(out)[-3000:]


def test_an_agent_whose_round_the_store_does_not_hold_restarts_its_workers_through_a_new_round(job):
    """The store came back holding another round (here: one written before either agent was back), so neither
    resumes: both restart their workers through a new round there, as before resume.py."""
    out, agents = job["out"], job["agents"]
    wait_for(lambda: starts(out) if len(starts(out)) == 2 else None, 90, "the first round's workers")
    job["store"].kill()
    job["store"].wait()
    wait_for(lambda: logs(out).count("stopped answering") == 2 or None, 15, "both agents to see the store go")
    job["store"] = start_store(job["port"], seed_round=7)
    again = wait_for(lambda: starts(out)[2:] if len(starts(out)) >= 4 else None, 30, "the workers of a new round")
    assert {rank for _, rank, _ in again} == {"0", "1"} and {ws for _, _, ws in again} == {"2"}
    assert logs(out).count("restarting the workers through a new round") == 2, logs(out)[-3000:]
    assert "resumed on it" not in logs(out)
    (out / "stop").touch()
    assert [a.wait(timeout=60) for a in agents] == [0, 0], logs(out)[-3000:]


def stored_round(port: int):
    """The rendezvous state the store at `port` holds, decoded by the store's own decoder."""
    import torch.distributed as dist

    from elasticjob_store import state

    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    return state.decode(client.get(f"torch.rendezvous.{RUN_ID}"))


@pytest.mark.parametrize("job", [("1:3", 4)], indirect=True)
def test_agents_that_lose_the_store_while_they_join_a_round_wait_for_it_and_join_there(job):
    """1..3 nodes and a 4 s last call: both agents sit in their first round's last call when the store goes."""
    out, agents = job["out"], job["agents"]
    wait_for(lambda: logs(out).count("Rendezvous'ing worker group") >= 2 or None, 90, "both agents joining")
    job["store"].kill()
    job["store"].wait()
    wait_for(lambda: logs(out).count("stopped answering") >= 1 or None, 15, "an agent to see the store go")
    job["store"] = start_store(job["port"])
    first = wait_for(lambda: starts(out) if len(starts(out)) >= 2 else None, 30, "the workers of the first round")
    assert {ws for _, _, ws in first} == {"2"}, first
    assert all(a.poll() is None for a in agents), f"an agent left with the store:\n{logs(out)[-3000:]}"
    (out / "stop").touch()
    assert [a.wait(timeout=60) for a in agents] == [0, 0], logs(out)[-3000:]


class Handler:
    """What Outage reads of torch's DynamicRendezvousHandler."""

    def __init__(self, store, join: timedelta | None):
        self._store = store
        self._state_holder = SimpleNamespace(_backend=SimpleNamespace(_store=store))
        if join is not None:
            self._settings = SimpleNamespace(timeout=SimpleNamespace(join=join))


@pytest.mark.parametrize("join, gone_for, waits", [
    (timedelta(seconds=600), 45, True),  # past the read timeout (30 s), within the join timeout: a node's eviction
    (timedelta(seconds=600), 601, False),
    (None, 45, False),  # a torch that keeps its settings elsewhere: the read timeout, as before
])
def test_an_agent_waits_for_its_store_as_long_as_torch_waits_for_a_round(join, gone_for, waits):
    # Where the store was, nothing listens now: each reconnect (a real TCPStore client) is refused.
    store = SimpleNamespace(host="127.0.0.1", port=free_port_pair(), timeout=timedelta(seconds=30))
    handler, outage = Handler(store, join), Outage()
    outage.since = time.monotonic() - gone_for
    error = RuntimeError("the store stopped answering")
    if waits:
        assert outage.lost(handler, error) == 0
    else:
        with pytest.raises(RuntimeError, match="stopped answering"):
            outage.lost(handler, error)


def test_a_store_still_gone_is_tried_without_a_store_client(monkeypatch):
    """A refused address is answered at once; only one that accepts gets a TCPStore client, whose connect retries
    with a backoff for its whole timeout (1.5 s each try, which made agents see a store back that late)."""
    import torch.distributed as dist

    from elasticjob_warm import outage

    real, made = dist.TCPStore, []
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **kw: made.append(a) or real(*a, **kw))
    port = free_port_pair()
    assert outage._connect("127.0.0.1", port, 30) is None
    assert made == []
    server = real("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True)
    client = outage._connect("127.0.0.1", port, 30)
    client.set("k", "v")
    assert server.get("k") == b"v" and len(made) == 1
