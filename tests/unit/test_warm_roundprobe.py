"""The link probe's place in the agent (elasticjob_warm/roundprobe.py): torch's real agent class patched at its
rendezvous, only where the environment asks, once; rounds too small to name an outlier skip the probe."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.distributed.elastic.agent.server import api

from elasticjob_warm import roundprobe


@pytest.fixture
def agent_class():
    original = api.SimpleElasticAgent._rendezvous
    yield api.SimpleElasticAgent
    api.SimpleElasticAgent._rendezvous = original


def test_the_agent_probes_after_its_rendezvous_only_where_asked_and_is_patched_once(agent_class):
    original = agent_class._rendezvous
    assert roundprobe.apply({}) and agent_class._rendezvous is original
    assert roundprobe.apply({roundprobe.PROBE_ENV: "0"}) and agent_class._rendezvous is original
    assert roundprobe.apply({roundprobe.PROBE_ENV: "1"}) and agent_class._rendezvous is not original
    patched = agent_class._rendezvous
    assert roundprobe.apply({roundprobe.PROBE_ENV: "1"}) and agent_class._rendezvous is patched


def test_a_setting_that_is_neither_one_nor_zero_is_refused():
    with pytest.raises(ValueError, match="ELASTICJOB_LINK_PROBE"):
        roundprobe.apply({roundprobe.PROBE_ENV: "yes"})


def test_the_probe_runs_after_the_rounds_rendezvous_with_its_store_rank_and_world(agent_class, monkeypatch):
    calls = []

    def rendezvous(self, worker_group):
        worker_group.store, worker_group.group_rank, worker_group.group_world_size = "round-store", 2, 3

    monkeypatch.setattr(agent_class, "_rendezvous", rendezvous)
    monkeypatch.setattr(roundprobe.linkprobe, "run", lambda *args: calls.append(args[:3]))
    roundprobe.apply({roundprobe.PROBE_ENV: "1"})
    agent_class._rendezvous(object(), SimpleNamespace())
    assert calls == [("round-store", 2, 3)]


@pytest.mark.parametrize("group", [
    SimpleNamespace(store="s", group_rank=0, group_world_size=2),  # a pair cannot say which end is slow
    SimpleNamespace(store="s", group_rank=0, group_world_size=1),
    SimpleNamespace(store=None, group_rank=0, group_world_size=3),
    SimpleNamespace(),
])
def test_rounds_that_cannot_name_an_outlier_are_not_probed(group, monkeypatch):
    monkeypatch.setattr(roundprobe.linkprobe, "run", lambda *args: pytest.fail("probed"))
    assert roundprobe.after_round(group, {}) is None
