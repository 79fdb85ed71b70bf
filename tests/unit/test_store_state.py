"""Decoding torch's rendezvous state: real states round-trip; hostile bytes are refused and never run."""

from __future__ import annotations

import base64
import builtins
import io
import os
import pickle
import subprocess
import sys

import pytest
from store_states import NOW, A, B, C, agent_pickle, fields, make_state

from elasticjob_store import state as store_state
from elasticjob_store.rdzv_classes import dumps
from elasticjob_store.state import NO_STATE, NodeDesc, RendezvousState, StateError, decode, encode


@pytest.mark.parametrize("state", [
    RendezvousState(),
    make_state(round=3, complete=True, participants=[A, B], waiting=[C]),
    make_state(round=1, deadline=NOW, participants=[A], redundant=[C], beats={A: 0.5, C: 9.0}),
    make_state(closed=True, participants=[NodeDesc("fd00::1", 1, 4)]),
])
def test_real_states_round_trip(state):
    assert fields(decode(encode(state))) == fields(state)


@pytest.mark.parametrize("protocol", [4, 5])
def test_the_protocols_agents_write_decode(protocol):
    state = make_state(round=2, complete=True, deadline=NOW, participants=[A, B], waiting=[C])
    assert fields(decode(base64.b64encode(agent_pickle(state, protocol)))) == fields(state)


@pytest.mark.parametrize("protocol", [0, 1, 2, 3])
def test_older_protocols_no_agent_writes_are_refused(protocol):
    # They name classes with the GLOBAL opcode and build sets by calling builtins.set.
    state = make_state(round=2, complete=True, participants=[A, B], waiting=[C])
    with pytest.raises(StateError, match="GLOBAL"):
        decode(base64.b64encode(agent_pickle(state, protocol)))


def test_agents_bytes_decode():
    # Exactly what torch's backend writes: b64encode(pickle.dumps(state)) (c10d_rendezvous_backend.set_state).
    state = make_state(round=1, complete=True, participants=[A, B])
    assert fields(decode(base64.b64encode(agent_pickle(state)))) == fields(state)


@pytest.mark.parametrize("raw", [b"", NO_STATE])
def test_no_state_yet(raw):
    assert decode(raw) is None


class Run:
    """Pickles as a call of `func(*args)`: what an attacker would write under the key."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def hostile_payloads(marker: str) -> dict[str, bytes]:
    touch = f"touch {marker}"
    code = f"open({marker!r}, 'w').close()"
    return {
        "os.system": pickle.dumps(Run(os.system, touch)),
        "builtins.eval": pickle.dumps(Run(builtins.eval, code)),
        "builtins.exec": pickle.dumps(Run(builtins.exec, code), protocol=2),
        "subprocess.Popen": pickle.dumps(Run(subprocess.Popen, ["touch", marker])),
        "protocol 0 GLOBAL": pickle.dumps(Run(os.system, touch), protocol=0),
        # Inside a real state, as a node's rank.
        "state with a hostile rank": _state_with_rank(Run(os.system, touch)),
    }


def _state_with_rank(rank) -> bytes:
    state = make_state(participants=[A])
    state.participants[A] = rank
    return dumps(state)


def test_hostile_pickles_are_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    for name, payload in hostile_payloads(str(marker)).items():
        with pytest.raises(StateError):
            decode(base64.b64encode(payload))
        assert not marker.exists(), f"{name} ran code"


def test_the_unpickler_alone_refuses_foreign_globals(tmp_path):
    # The opcode walk runs first; this checks the second line of defence on its own.
    marker = tmp_path / "pwned"
    for payload in (pickle.dumps(Run(os.system, f"touch {marker}")), pickle.dumps(Run(builtins.eval, "1"))):
        with pytest.raises(StateError, match="never contains"):
            store_state._StateUnpickler(io.BytesIO(payload)).load()
    assert not marker.exists()


def test_size_is_capped():
    with pytest.raises(StateError, match="more than"):
        decode(b"A" * (store_state.MAX_STATE_BYTES + 4))


def test_deep_nesting_is_refused_before_unpickling():
    # EMPTY_TUPLE then TUPLE1 x 100: harmless at 100, but the same at millions overflows the C stack when hashed.
    deep = b"\x80\x04)" + b"\x85" * 100 + b"."
    with pytest.raises(StateError, match="nests deeper"):
        decode(base64.b64encode(deep))


def test_deep_nesting_that_would_crash_the_process_is_refused():
    # 3 million levels kill a Python 3.11 process when hashed (measured): here it must be an error, in a
    # subprocess so that a regression fails the test instead of the test runner.
    code = ("import base64, elasticjob_store.state as s\n"
            "s.MAX_STATE_BYTES = 1 << 30\n"
            "deep = b'\\x80\\x04}' + b')' + b'\\x85' * 3_000_000 + b'K\\x01s.'\n"
            "try:\n    s.decode(base64.b64encode(deep))\nexcept s.StateError as e:\n    print('refused', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "refused" in result.stdout, result.stdout + result.stderr


def test_a_node_that_contains_itself_is_an_error_not_a_crash():
    node = NodeDesc("10.0.0.9", 1, 0)
    participants = {node: 0}  # hashed before the cycle exists
    object.__setattr__(node, "addr", (node,))
    state = make_state()
    state.participants = participants
    with pytest.raises(StateError):
        decode(base64.b64encode(dumps(state)))


def _with(**changes) -> bytes:
    state = make_state(round=1, complete=True, participants=[A, B])
    for name, value in changes.items():
        setattr(state, name, value)
    return base64.b64encode(dumps(state))


@pytest.mark.parametrize("raw, message", [
    (b"!!not base64!!", "not base64"),
    (base64.b64encode(b"\x80\x04K\x01."), "not a _RendezvousState"),
    (base64.b64encode(dumps(NodeDesc("10.0.0.1", 1, 0))), "not a _RendezvousState"),
    (base64.b64encode(b"\x80\x04K"), "malformed"),
    (_with(round=-1), "round"),
    (_with(round=True), "round"),
    (_with(complete=1), "complete"),
    (_with(participants={"10.0.0.1": 0}), "not a _NodeDesc"),
    (_with(participants={A: "0"}), "rank"),
    (_with(wait_list={A: 1}), "wait_list is not a set"),
    (_with(last_heartbeats={A: NOW.replace(tzinfo=None)}), "UTC datetime"),
    (_with(deadline=12), "deadline"),
    (_with(deadline=12.5), "BINFLOAT"),
    (_with(extra=1), "fields"),
    (_with(participants={NodeDesc("", 1, 0): 0}), "address"),
    (_with(participants={NodeDesc("10.0.0.1", "1", 0): 0}), "pid"),
])
def test_wrong_shapes_are_refused(raw, message):
    with pytest.raises(StateError, match=message):
        decode(raw)


def test_encode_refuses_what_decode_would():
    state = make_state(participants=[A])
    state.round = "1"
    with pytest.raises(StateError):
        encode(state)


def test_only_five_globals_are_allowed():
    assert sorted(name for _, name in store_state.ALLOWED_GLOBALS) == [
        "_NodeDesc", "_RendezvousState", "datetime", "timedelta", "timezone"]


_RDZV = b"torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def _unicode(text: bytes) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text  # SHORT_BINUNICODE


# Pickles that act on the class _NodeDesc itself, not on an instance of it: setting a class attribute
# outlives the request, so one such write would refuse every genuine state until the store restarts. The
# C unpickler itself refuses the dict-state and item forms (a class's __dict__ is read-only); the walk
# refuses all of them before any runs.
_NODE_CLASS = _unicode(_RDZV) + _unicode(b"_NodeDesc") + b"\x93"  # STACK_GLOBAL
_NO_HASH = b"}" + _unicode(b"__hash__") + b"Ns"  # {"__hash__": None}
CLASS_MUTATIONS = {
    # BUILD with (None, slotstate): the unpickler calls setattr(_NodeDesc, "__hash__", None).
    "BUILD slot state on the class": b"\x80\x04" + _NODE_CLASS + b"N" + _NO_HASH + b"\x86b.",
    "BUILD dict state on the class": b"\x80\x04" + _NODE_CLASS + _NO_HASH + b"b.",
    "BUILD on the class fetched from the memo": (  # (class, class) with the second one built
        b"\x80\x04(" + _NODE_CLASS + b"\x94h\x00N" + _NO_HASH + b"\x86bt."),
    "SETITEM on the class": b"\x80\x04" + _NODE_CLASS + _unicode(b"__hash__") + b"Ns.",
    "SETITEMS on the class": b"\x80\x04" + _NODE_CLASS + b"(" + _unicode(b"__hash__") + b"Nu.",
}


@pytest.mark.parametrize("payload", CLASS_MUTATIONS.values(), ids=list(CLASS_MUTATIONS))
def test_a_pickle_cannot_change_the_classes_it_names(payload):
    # In a subprocess: a regression poisons torch's class in that process, not in the test runner.
    code = ("import base64, sys, elasticjob_store.state as s\n"
            "from store_states import A, make_state\n"
            "hash_before = s.NodeDesc.__hash__\n"
            "try:\n    s.decode(base64.b64encode(sys.stdin.buffer.read()))\n"
            "except s.StateError as e:\n    print('refused:', e)\n"
            "assert s.NodeDesc.__hash__ is hash_before, 'the class was changed'\n"
            "genuine = make_state(round=3, complete=True, participants=[A])\n"
            "assert s.decode(s.encode(genuine)).participants == {A: 0}\n"
            "print('genuine state decodes')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, timeout=120,
                            env=env)
    out = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, out
    assert "refused:" in out and "genuine state decodes" in out, out
