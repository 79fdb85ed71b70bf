"""A rendezvous value that would fail every agent is not left for the next wave: a closed round the job did not
close is opened again on the operator's evidence (planner/reopen.py, actions.reopen), and a value the decoder
refuses is replaced by the store itself (Control.replace_refused) on a real TCPStore."""

from __future__ import annotations

import base64
import pickle
from datetime import timedelta

import pytest
import torch.distributed as dist
from factory import NOW, job, observed, rdzv, running_status, store, worker

from elasticjob import planner
from elasticjob_store import actions
from elasticjob_store.control import Control
from elasticjob_store.protocol import Reopen
from elasticjob_store.state import RendezvousState, decode, encode, state_key

LEFT = dict(phase="Failed", exit_code=87, rendezvous_failed="RendezvousClosedError",
            finished_at=NOW - timedelta(seconds=1))


def reopens(workers, **view) -> list[Reopen]:
    result = planner.plan(job(running_status()), observed([rdzv(), *workers], store=store(**view)), NOW)
    return [a.request for a in result.actions if isinstance(a, planner.StoreAction) and isinstance(a.request, Reopen)]


@pytest.mark.parametrize(("workers", "view", "expected"), [
    ([worker(0), worker(1, **LEFT)], {"closed": True, "round": 7}, [Reopen(7)]),
    ([worker(0), worker(1)], {"closed": True, "round": 7}, []),  # no agent left on it yet: no evidence
    ([worker(0, phase="Succeeded", exit_code=0), worker(1, **LEFT)], {"closed": True}, []),  # the job finished
    ([worker(0), worker(1, **LEFT)], {"closed": False}, []),  # open: the agent left for another reason
    ([worker(0), worker(1, **LEFT)], {"closed": True, "nudges_off": "torch 2.99"}, []),  # state not understood
])
def test_a_closed_round_is_opened_again_only_on_the_operators_evidence(workers, view, expected):
    assert reopens(workers, **view) == expected


def closed_state(round_number: int) -> RendezvousState:
    state = actions.clean(round_number)
    state.closed = True
    return state


def test_the_store_opens_the_round_after_the_closed_one_and_leaves_another_alone():
    outcome = actions.reopen(closed_state(7), 7)
    assert outcome.done and outcome.state is not None
    assert (outcome.state.round, outcome.state.closed, outcome.state.participants) == (8, False, {})
    assert not actions.reopen(closed_state(7), 6).done  # fenced by the round the operator saw
    assert not actions.reopen(actions.clean(7), 7).done  # open already: a repeat changes nothing


def test_a_value_the_decoder_refuses_is_replaced_by_an_open_round_on_the_next_poll():
    tcp = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    control = Control(tcp, "run-1", 1, 3, log=lambda _: None)
    value: list = []
    for _ in range(30):
        value = [value] * 10
    tcp.set(state_key("run-1"), base64.b64encode(pickle.dumps(value)))  # 10**30 leaves through memo references
    control.poll()
    state = decode(tcp.get(state_key("run-1")))
    assert state is not None and state.round == 1 and not state.closed
    tcp.set(state_key("run-1"), encode(closed_state(3)))  # a valid state, even closed, is torch's: left alone
    control.poll()
    assert decode(tcp.get(state_key("run-1"))).closed
