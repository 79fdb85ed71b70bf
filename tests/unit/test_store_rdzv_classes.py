"""The store's stand-ins of torch's rendezvous classes (elasticjob_store/rdzv_classes.py) against the torch
installed here: what the store writes is byte for byte what an agent writes, and each side reads the other's."""

from __future__ import annotations

import base64
import pickle

import pytest
from store_states import NOW, A, B, C, agent_pickle, as_torch, fields, make_state

from elasticjob_store import rdzv_classes
from elasticjob_store.state import RendezvousState, decode, decode_as, encode, torch_kinds

SHAPES = {
    "empty": {},
    "a complete round": {"round": 3, "complete": True, "deadline": NOW, "participants": [A, B]},
    "waiting and redundant nodes": {"round": 9, "participants": [A], "waiting": [B, C], "redundant": [C],
                                    "beats": {A: 0.5, B: 1.5, C: 30.0}},
    "closed": {"round": 2, "closed": True, "participants": [C, B, A]},
}
STATES = {name: make_state(**shape) for name, shape in SHAPES.items()}


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("name", list(STATES))
def test_the_store_writes_the_bytes_an_agent_writes(name, protocol):
    agents = make_state(**SHAPES[name], kinds=torch_kinds())  # built in the same order: the same sets' layouts
    assert rdzv_classes.dumps(STATES[name], protocol) == pickle.dumps(agents, protocol=protocol)


@pytest.mark.parametrize("name", list(STATES))
def test_an_agents_state_reads_as_stand_ins_and_ours_reads_as_torchs(name):
    state = STATES[name]
    ours = decode(base64.b64encode(agent_pickle(state)))
    assert type(ours) is RendezvousState and fields(ours) == fields(state)
    theirs = pickle.loads(base64.b64decode(encode(ours)))  # what torch's backend does with our write
    assert type(theirs) is torch_kinds().state and vars(theirs) == vars(as_torch(state))


def test_the_agents_decoder_builds_torchs_own_classes():
    state = STATES["waiting and redundant nodes"]
    theirs = decode_as(base64.b64encode(agent_pickle(state)), torch_kinds())
    assert type(theirs) is torch_kinds().state and vars(theirs) == vars(as_torch(state))
    assert {type(node) for node in theirs.last_heartbeats} == {torch_kinds().node}


def test_a_node_keeps_torchs_equality_order_hash_and_name():
    torch_node = torch_kinds().node
    for ours in (A, B, C):
        twin = torch_node(ours.addr, ours.pid, ours.local_id)
        assert hash(ours) == hash(twin) and repr(ours) == repr(twin)
    assert sorted([C, A, B]) == [A, B, C]
    assert sorted([torch_node(n.addr, n.pid, n.local_id) for n in (C, A, B)])[0].addr == A.addr
