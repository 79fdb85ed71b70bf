"""Which round an agent may resume on a store that came back (elasticjob_warm/resume.py), on torch's own state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from elasticjob_warm.resume import moved_on, running_in, same_round

A, B, C = (_NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in (1, 2, 3))
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def state(round_: int = 3, participants: dict | None = None, complete: bool = True, closed: bool = False,
          waiting: tuple = ()) -> _RendezvousState:
    found = _RendezvousState()
    found.round, found.complete, found.closed = round_, complete, closed
    found.participants = {A: 0, B: 1} if participants is None else participants
    found.wait_list = set(waiting)
    found.last_heartbeats = {node: NOW - timedelta(seconds=4) for node in found.participants}
    return found


@pytest.mark.parametrize("found, resumes", [
    (state(), True),
    (state(waiting=(C,)), True),  # a newcomer waiting: resumed, and the agents restart for it as torch would
    (state(round_=4), False),  # another round formed there
    (state(complete=False), False),  # a round forming there
    (state(closed=True), False),  # the training ended
    (state(participants={A: 1, B: 0}), False),  # other ranks: another round, whatever its number
    (state(participants={A: 0}), False),  # B gone from it
    (state(participants={A: 0, B: 1, C: 2}), False),
])
def test_an_agent_goes_on_only_in_the_very_round_it_runs(found, resumes):
    assert same_round(found, state(), A) is resumes


@pytest.mark.parametrize("mine, runs", [
    (state(), True),
    (state(participants={B: 0}), False),  # taken out of the round (a join begins with that)
    (state(complete=False), False),
    (state(closed=True), False),
])
def test_only_a_participant_of_a_complete_open_round_writes_it_back(mine, runs):
    assert running_in(mine, A) is runs


def test_the_heartbeats_written_back_are_moved_on_by_the_time_without_a_store_never_past_now():
    mine = state()
    mine.last_heartbeats[B] = NOW - timedelta(seconds=1)
    seed = moved_on(mine, timedelta(seconds=3), NOW)
    assert seed.last_heartbeats == {A: NOW - timedelta(seconds=1), B: NOW}
    assert mine.last_heartbeats[A] == NOW - timedelta(seconds=4)  # the agent's own view is left as it was
    assert seed.participants == mine.participants and seed.round == mine.round
