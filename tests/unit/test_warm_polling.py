"""Shorter rendezvous polls (elasticjob_warm.polling), against torch's own rendezvous classes."""

from __future__ import annotations

import types

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
from torch.distributed.elastic.rendezvous import utils as rdzv_utils
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from elasticjob_warm import polling


@pytest.mark.parametrize("max_nodes, seconds", [(1, 0.1), (3, 0.1), (10, 0.1), (50, 0.5), (100, 1.0), (5000, 1.0)])
def test_the_poll_grows_with_the_job(max_nodes, seconds):
    assert polling.poll_seconds(max_nodes, environ={}) == pytest.approx(seconds)


def test_the_environment_sets_the_poll():
    assert polling.poll_seconds(3, environ={polling.POLL_ENV: "0.5"}) == 0.5


@pytest.mark.parametrize("value", ["abc", "0", "-1", "61", "nan"])
def test_a_bad_poll_is_refused_by_name(value):
    with pytest.raises(ValueError, match=polling.POLL_ENV):
        polling.poll_seconds(3, environ={polling.POLL_ENV: value})


@pytest.fixture
def quickened():
    undo = polling.quicken(0.1)
    assert undo is not None
    yield
    undo()


@pytest.fixture
def sleeps(monkeypatch):
    asked: list[float] = []
    monkeypatch.setattr(rdzv_utils, "time", types.SimpleNamespace(sleep=asked.append))
    return asked


def test_the_wait_between_reads_is_the_poll(quickened, sleeps):
    rdzv._delay(seconds=1)  # as the op executor asks, by name
    rdzv._delay(seconds=(0.2, 0.2))  # the first round's random skew is torch's own
    assert sleeps == [0.1, 0.2]


def test_undo_gives_torch_its_poll_back(sleeps):
    polling.quicken(0.1)()
    rdzv._delay(seconds=1)
    assert sleeps == [1]


class CountingBackend(C10dRendezvousBackend):
    reads = 0

    def get_state(self):
        self.reads += 1
        return super().get_state()


def reads_after(elapsed: float, monkeypatch) -> int:
    """How often a state holder built by torch reads the store when asked twice, `elapsed` seconds apart."""
    now = [1000.0]
    monkeypatch.setattr(rdzv, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    store = dist.HashStore()
    backend = CountingBackend(store, "run")
    holder = rdzv.DynamicRendezvousHandler.from_backend("run", store, backend, 1, 3)._state_holder
    holder.sync()
    now[0] += elapsed
    holder.sync()
    return backend.reads


def test_a_training_agent_reads_the_store_each_poll(quickened, monkeypatch):
    assert reads_after(0.2, monkeypatch) == 2


def test_torch_alone_serves_a_second_old_state_from_its_cache(monkeypatch):
    assert reads_after(0.2, monkeypatch) == 1


def test_an_unknown_rendezvous_is_left_alone(monkeypatch):
    monkeypatch.setattr(rdzv._BackendRendezvousStateHolder, "__init__", lambda self, backend, settings: None)
    torch_delay = rdzv._delay
    assert polling.quicken(0.1) is None
    assert rdzv._delay is torch_delay
