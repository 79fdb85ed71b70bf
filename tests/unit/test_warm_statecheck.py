"""The agent never unpickles what the store holds (elasticjob_warm/statecheck.py): a pickle written under the
rendezvous key by anyone who reaches the store's port is refused, logged once, and replaced by the agent's next
write. Torch's own state holder on a real TCPStore (milliseconds), then a real agent (`python -m
elasticjob_warm.torchrun`, seconds: it imports torch) that trains through two poisonings."""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from elasticjob_store import state as rdzv_state
from elasticjob_warm import statecheck
from helpers import wait_for

RUN_ID = "poisoned"
KEY = f"torch.rendezvous.{RUN_ID}"


class Payload:
    """What an attacker writes: unpickling it opens (creates) `path`; with os.system it could run anything."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def poison(store, marker: Path) -> None:
    store.set(KEY, base64.b64encode(pickle.dumps(Payload(marker))))


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)


@pytest.fixture
def guarded(monkeypatch):
    """statecheck applied in this process, and undone after the test."""
    monkeypatch.setattr(rdzv, "pickle", rdzv.pickle)
    monkeypatch.setattr(rdzv._BackendRendezvousStateHolder, "sync", rdzv._BackendRendezvousStateHolder.sync)
    assert statecheck.apply() is None


def holder(store):
    settings = rdzv.RendezvousSettings(RUN_ID, min_nodes=1, max_nodes=2, timeout=rdzv.RendezvousTimeout(),
                                       keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=3)
    return rdzv._BackendRendezvousStateHolder(C10dRendezvousBackend(store, RUN_ID), settings, cache_duration=0)


def stored(store) -> rdzv_state.RendezvousState | None:
    return rdzv_state.decode(store.get(KEY))


def test_a_poisoned_state_is_refused_logged_once_and_read_as_nothing_new(guarded, store, tmp_path, capfd):
    state_holder = holder(store)
    poison(store, tmp_path / "marker")
    assert state_holder.sync() is None and state_holder.sync() is None  # read twice
    assert not (tmp_path / "marker").exists()
    assert vars(state_holder.state) == vars(rdzv._RendezvousState())  # before its first read: empty
    lines = [line for line in capfd.readouterr().err.splitlines() if "refused" in line]
    assert len(lines) == 1 and KEY in lines[0] and "io.open" in lines[0], lines
    assert str(tmp_path) not in lines[0]  # the payload is not logged
    # The agent's next write replaces the poison, through torch's compare-and-set on the poison's token.
    state_holder.state.round = 4
    state_holder.mark_dirty()
    assert state_holder.sync() is True
    assert stored(store).round == 4


def test_a_write_that_finds_poison_where_its_last_read_was_goes_over_it(guarded, store, tmp_path):
    state_holder = holder(store)
    state_holder.state.round = 2
    state_holder.mark_dirty()
    assert state_holder.sync() is True
    poison(store, tmp_path / "marker")  # after the agent's read, before its next write
    state_holder.state.round = 3
    state_holder.mark_dirty()
    assert state_holder.sync() is True
    assert not (tmp_path / "marker").exists()
    assert stored(store).round == 3 and state_holder.state.round == 3


def test_a_good_state_reads_as_torch_reads_it(guarded, store):
    writer, reader = holder(store), holder(store)
    writer.state.round, writer.state.closed = 7, True
    writer.mark_dirty()
    assert writer.sync() is True
    reader.sync()
    assert (reader.state.round, reader.state.closed) == (7, True)


def test_a_holder_that_is_not_the_known_one_is_left_alone(monkeypatch):
    def sync(self):  # reads the state some other way
        return None

    monkeypatch.setattr(rdzv._BackendRendezvousStateHolder, "sync", sync)
    assert statecheck.apply() == "the rendezvous state holder's sync() is not the one known"
    assert rdzv._BackendRendezvousStateHolder.sync is sync and rdzv.pickle is pickle


WORKER = textwrap.dedent("""
    import os, sys, time
    out = sys.argv[1]
    open(os.path.join(out, "started"), "w").close()
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.02)
""")


def test_a_real_agent_trains_through_poisoned_states_and_never_runs_them(store, tmp_path):
    """Poisoned before the agent's first read (it joins over it), and again while its worker trains."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    poison(store, tmp_path / "before")
    env = dict(os.environ, ELASTICJOB_WARM_PRELOAD="decimal", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    with open(tmp_path / "agent.log", "w") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "elasticjob_warm.torchrun", "--nnodes=1", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={RUN_ID}",
             "--max-restarts=0", "--rdzv-conf=is_host=false,last_call_timeout=1,keep_alive_interval=1",
             str(tmp_path / "worker.py"), str(out)], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        text = lambda: (tmp_path / "agent.log").read_text()  # noqa: E731
        wait_for(lambda: (out / "started").exists() or agent.poll() is not None, 90, "the worker to start")
        assert agent.poll() is None, text()[-3000:]
        poison(store, tmp_path / "during")
        wait_for(lambda: text().count("refused") >= 2 or agent.poll() is not None, 30, "the second refusal")
        (out / "go").touch()
        assert agent.wait(timeout=60) == 0, text()[-3000:]
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
            agent.wait()
    assert not (tmp_path / "before").exists() and not (tmp_path / "during").exists()
    refusals = [line for line in text().splitlines() if "refused" in line]
    assert len(refusals) == 2 and all(KEY in line for line in refusals), refusals
    assert str(tmp_path / "before") not in text() and str(tmp_path / "during") not in text()
    assert stored(store).closed  # the agent's last write (closing the rendezvous) replaced the poison
