"""The decoder's work budget: a few hundred bytes must not buy seconds of work, a crash or a message of
megabytes. Each hostile pickle is written opcode by opcode and base64'd as torch's backend stores it, and each
refusal must come as a StateError within a second (the store reads the key four times a second)."""

from __future__ import annotations

import base64
import pickle
import pickletools
import time  # process_time: this process's CPU seconds, which a busy machine does not inflate as it does the wall clock's

import pytest
from store_states import A, agent_pickle, fields, make_state

from elasticjob_store import pickle_walk
from elasticjob_store import state as store_state
from elasticjob_store.rdzv_classes import dumps
from elasticjob_store.state import NodeDesc, StateError, decode, validate
from elasticjob_warm import statecheck

_RDZV = b"torch.distributed.elastic.rendezvous.dynamic_rendezvous"
# A state's fields, each with the smallest value torch could have written, in torch's order.
_PLAIN = {"round": b"K\x00", "complete": b"\x89", "deadline": b"N", "closed": b"\x89", "participants": b"}",
          "wait_list": b"\x8f", "redundancy_list": b"\x8f", "last_heartbeats": b"}"}
_FIRST_FREE = 5  # memo entries the header of _state_pickle takes


def _unicode(text: bytes) -> bytes:
    return (b"\x8c" + bytes([len(text)]) if len(text) < 256 else b"X" + len(text).to_bytes(4, "little")) + text


def _get(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")  # BINGET, LONG_BINGET


def _state_pickle(extra: bytes = b"", **values: bytes) -> bytes:
    """A _RendezvousState as protocol 4 writes it, with the opcodes of some fields' values replaced (and
    `extra` key-value opcodes added to its fields)."""
    out = b"\x80\x04" + _unicode(_RDZV) + b"\x94" + _unicode(b"_RendezvousState") + b"\x94\x93\x94)\x81\x94}\x94("
    for name, plain in _PLAIN.items():
        out += _unicode(name.encode()) + values.get(name, plain)
    return out + extra + b"ub."  # SETITEMS, BUILD, STOP


def _b64(data: bytes) -> bytes:
    return base64.b64encode(data)


def _shared_tuples(fan: int, levels: int, first: int = _FIRST_FREE) -> bytes:
    """(1,), then `levels` tuples, each holding the one before `fan` times: once itself, then by memo reference.
    fan ** levels leaves from about 2 * fan * levels bytes; memoised from index `first` on."""
    out = b"(" * levels + b"K\x01\x85\x94"  # a MARK per level, then (1,) memoised
    for level in range(levels):
        out += _get(first + level) * (fan - 1) + b"t\x94"  # TUPLE down to its MARK, memoised
    return out


def _dicts_filled_after_placement(count: int) -> bytes:
    """A tuple of dicts d0 ... d_count where each d_i is made empty, placed in d_(i-1), then filled: nested
    `count` deep, while each dict held only an empty one when it was placed."""
    out = b"(}\x94"  # MARK, d0 memoised
    for level in range(1, count + 1):
        out += _get(_FIRST_FREE + level - 1) + b"K\x00}\x94s"  # d_(i-1)[0] = d_i (a new, empty, memoised dict)
    return out + b"t"  # the copies of d_(i-1) each SETITEM left, gathered in one tuple


def _refused(raw: bytes, match: str) -> StateError:
    start = time.process_time()
    with pytest.raises(StateError, match=match) as caught:
        decode(raw)
    took = time.process_time() - start
    assert took < 1.0, f"refused only after {took:.1f} s"
    assert len(str(caught.value)) < 200, "the message must name types, not quote the value"
    return caught.value


def _long1(value: int) -> bytes:
    encoded = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)  # as the pickler writes it
    return b"\x8a" + bytes([len(encoded)]) + encoded


def _node(addr: bytes, pid: bytes, local_id: bytes = b"K\x00") -> bytes:
    """A _NodeDesc as torch's pickler writes it (NEWOBJ, then BUILD with its fields), from its fields' opcodes;
    _get(0) is the module _state_pickle memoises first."""
    fields = _unicode(b"addr") + addr + _unicode(b"pid") + pid + _unicode(b"local_id") + local_id
    return _get(0) + _unicode(b"_NodeDesc") + b"\x93)\x81}(" + fields + b"ub"


def _participants(nodes: list[bytes]) -> bytes:
    return b"}(" + b"".join(node + b"J" + rank.to_bytes(4, "little") for rank, node in enumerate(nodes)) + b"u"


def _cancelling_pids(count: int) -> list[tuple[int, int]]:
    """(pid, local_id) pairs under 2**61 - 1 whose nodes hash alike whatever the address: pid * P2 is t * 2**33,
    which the tuple hash's rotation moves to the bottom bits untouched, and local_id * P2 takes P1 * t away."""
    p1, p2, mod = 11400714785074694791, 14029467366897019727, 2**64  # tuple hash primes (Objects/tupleobject.c)
    over_p2 = pow(p2, -1, mod)
    pairs, t = [], 0
    while len(pairs) < count:
        t += 1
        pid, local_id = (t << 33) * over_p2 % mod, -p1 * t * over_p2 % mod
        if max(pid, local_id) < 2**61 - 1:  # below it, an int is its own hash
            pairs.append((pid, local_id))
    return pairs


def _nodes(subnet: int, count: int) -> list[NodeDesc]:
    return [NodeDesc(f"10.{subnet}.{i // 256}.{i % 256}", 100_000 + i, 0) for i in range(count)]


@pytest.mark.parametrize("participants, waiting, redundant", [(1024, 0, 0), (1024, 1024, 1024)])
def test_a_real_state_of_max_nodes_decodes_far_inside_the_budget(participants, waiting, redundant):
    # MAX_NODES (elasticjob.models) is 1024: a job's largest state has that many in each list.
    state = make_state(round=7, complete=True, participants=_nodes(1, participants), waiting=_nodes(2, waiting),
                       redundant=_nodes(3, redundant))
    data = agent_pickle(state)
    expanded = pickle_walk.check_structure(data)
    assert expanded * 7 <= pickle_walk.MAX_EXPANDED, f"a real state expands to {expanded}"
    start = time.process_time()
    assert fields(decode(_b64(data))) == fields(state)
    assert time.process_time() - start < 1.0


def test_real_nodes_at_the_edges_of_their_ranges_decode_and_use_only_32_bit_ints():
    # Linux pids reach 2**22 - 1 at most (PID_MAX_LIMIT); local_id counts handlers made in one process.
    def nodes(subnet: int) -> list[NodeDesc]:
        return [NodeDesc(f"worker-{subnet}-{i}.job.ns.svc.cluster.local", 2**22 - 1 - i, i) for i in range(1024)]

    state = make_state(round=2**31 - 1, participants=nodes(1), waiting=nodes(2), redundant=nodes(3))
    data = agent_pickle(state)
    assert {op.name for op, _, _ in pickletools.genops(data)}.isdisjoint({"LONG1", "LONG4"})
    start = time.process_time()
    assert fields(decode(_b64(data))) == fields(state)
    assert time.process_time() - start < 1.0


@pytest.mark.parametrize("pairs", [
    [(k * (2**61 - 1), 0) for k in range(1, 7001)],  # every pid hashes to 0
    _cancelling_pids(7000),  # pid and local_id cancel in the tuple hash, whatever the address
], ids=["pids of one hash", "pids and local ids that cancel"])
def test_nodes_that_share_a_hash_are_refused_before_they_are_hashed(pairs):
    # Each insertion compared with every node before it: 7,000 took 5.9 s and were accepted.
    assert len({hash(NodeDesc("10.0.0.1", pid, local_id)) for pid, local_id in pairs[:100]}) == 1
    nodes = [_node(_unicode(b"10.0.0.1"), _long1(pid), _long1(local_id)) for pid, local_id in pairs]
    _refused(_b64(_state_pickle(participants=_participants(nodes))), "LONG1")


@pytest.mark.parametrize("addr, pid, match", [
    (b"J\xff\xff\xff\x7f", b"K\x01", "_NodeDesc an int addr"),  # the tuple hash would be the writer's to choose
    (b"K\x01K\x02\x86", b"K\x01", "_NodeDesc a tuple addr"),
    (b"N", b"K\x01", "_NodeDesc a constant addr"),
    (_unicode(b"10.0.0.1"), b"K\x01K\x02\x86", "_NodeDesc a tuple pid"),
    (_unicode(b"10.0.0.1"), b"J\xff\xff\xff\xff", "pid or local id is a negative int"),  # left to validate
], ids=["int addr", "tuple addr", "None addr", "tuple pid", "negative pid"])
def test_node_fields_of_kinds_torch_never_writes_are_refused(addr, pid, match):
    _refused(_b64(_state_pickle(participants=_participants([_node(addr, pid)]))), match)


def test_a_node_made_by_calling_its_class_is_refused():
    # REDUCE runs __init__ with its arguments, which BUILD's check never sees.
    node = _get(0) + _unicode(b"_NodeDesc") + b"\x93" + b"J\xff\xff\xff\x7fK\x01K\x00\x87R"
    _refused(_b64(_state_pickle(participants=_participants([node]))), "by calling it")


_TIMEDELTA = b"\x8c\x08datetime\x8c\x09timedelta\x93K\x01K\x02K\x03\x87R"  # timedelta(1, 2, 3)


@pytest.mark.parametrize("value, match", [
    (b"}" + b"K\x01K\x02K\x03\x87" + b"K\x00s", "a tuple a dict key"),
    (b"\x8f(" + b"K\x01K\x02K\x03\x87" + b"\x90", "a tuple a dict key or set member"),
    (b"}" + _TIMEDELTA + b"K\x00s", "an instance a dict key"),
], ids=["tuple key", "tuple member", "timedelta key"])
def test_keys_whose_hashes_a_writer_could_make_equal_are_refused(value, match):
    # A tuple's hash, and a datetime's or timedelta's, is computed from ints alone, the same in every process:
    # keys that share one can be searched for once and sent to every store.
    _refused(_b64(_state_pickle(round=value)), match)


@pytest.mark.parametrize("where", ["participants", "round"])
def test_memo_references_that_expand_to_a_billion_leaves_are_refused_before_anything_is_built(where):
    # 32 ** 6: 10**9 leaves from 400 bytes. As a dict key the unpickler hashed all of them (8 s measured for
    # 10**9, the GIL held); as a field, the message quoted its repr (10**10 ran 67 s into MemoryError).
    bomb = _shared_tuples(32, 6)
    value = b"}" + bomb + b"K\x00s" if where == "participants" else bomb  # {bomb: 0}, or the bomb itself
    _refused(_b64(_state_pickle(**{where: value})), "expands to more than")


def test_the_budget_counts_an_object_again_for_every_place_it_is_put():
    # One value of 90,000 leaves (300 references to a tuple of 300) in 4,000 dicts, left on the unpickler's stack
    # under the state (STOP takes only the top): no object is bigger than the budget, but the 4,000 places hold
    # 3.6 * 10**8 leaves to check or compare. (As a key the unpickler hashed them all; tuple keys are refused
    # now, see test_keys_whose_hashes_a_writer_could_make_equal_are_refused.)
    dicts = (b"}K\x00" + _get(2) + b"s") * 4000  # _get(2): the last tuple _shared_tuples(300, 2, 0) memoises
    under = b"\x80\x04" + _shared_tuples(300, 2, first=0) + dicts
    _refused(_b64(under + _state_pickle()[2:]), "expands to more than")


def test_validate_names_a_huge_bad_field_by_its_type_only():
    # 10**7 leaves from eight tuples in memory: its repr is 50 MB, a bigger one never ends.
    huge = (1,)
    for _ in range(7):
        huge = (huge,) * 10
    state = make_state(participants=[A])
    state.round = huge
    start = time.process_time()
    with pytest.raises(StateError, match="round is a tuple") as caught:
        validate(state)
    assert time.process_time() - start < 1.0
    assert len(str(caught.value)) < 200


_LONG = b"x" * 600_000  # inside the byte cap once base64'd


@pytest.mark.parametrize("data, match", [
    (_state_pickle(round=_unicode(_LONG)), "round is a str"),
    (_state_pickle(complete=_unicode(_LONG)), "complete is a str"),
    (_state_pickle(deadline=_unicode(_LONG)), "deadline is a str"),
    (_state_pickle(participants=b"}" + _unicode(_LONG) + b"K\x00s"), "node is a str"),
    (_state_pickle(last_heartbeats=_unicode(_LONG)), "last_heartbeats is a str"),
    (_state_pickle(extra=_unicode(_LONG) + b"K\x00"), "other fields"),
    (b"\x80\x04" + _unicode(_LONG) + _unicode(b"x") + b"\x93.", "global"),
], ids=["round", "complete", "deadline", "participant", "heartbeats", "field name", "global"])
def test_messages_never_quote_what_was_written(data, match):
    error = _refused(_b64(data), match)
    assert "xxxx" not in str(error)


def test_a_node_whose_fields_are_wrong_is_named_by_types():
    node = NodeDesc("10.0.0.1", "x" * 100_000, 0)
    error = _refused(_b64(dumps(make_state(participants=[node]))), "_NodeDesc a str pid")
    assert "xxxx" not in str(error) and "10.0.0.1" not in str(error)


def test_nesting_hidden_by_filling_after_placement_is_refused():
    # 20,000 dicts deep while the old depth count saw 1: the message's repr then raised RecursionError.
    _refused(_b64(_state_pickle(round=_dicts_filled_after_placement(20_000))), "after placing it")


def test_an_object_that_holds_itself_is_refused_by_the_walk():
    # {0: itself}: EMPTY_DICT, MEMOIZE, key, BINGET of itself, SETITEM.
    _refused(_b64(_state_pickle(round=b"}\x94K\x00" + _get(_FIRST_FREE) + b"s")), "after placing it")


def test_depth_is_checked_again_as_a_container_fills():
    # {0: a tuple 31 deep}: within the cap where each was made; the dict reaches 32 when it takes the tuple and
    # the state's own dict 33 when it takes that.
    deep_value = b"}K\x00)" + b"\x85" * 31 + b"s"
    _refused(_b64(_state_pickle(participants=deep_value)), "nests deeper")


def test_a_memo_index_far_past_the_next_is_refused_before_the_unpickler_allocates_it():
    # LONG_BINPUT 2**26: the C unpickler would grow its memo to 2**27 entries (1 GiB) and clear them.
    _refused(_b64(b"\x80\x04K\x01r" + (1 << 26).to_bytes(4, "little") + b"."), "memo entry")


@pytest.mark.parametrize("error", [RecursionError, MemoryError, OverflowError, TypeError, ValueError, KeyError])
def test_whatever_unpickling_raises_is_a_state_error(monkeypatch, error):
    def load(self):
        raise error("a message that quotes the bytes")

    monkeypatch.setattr(store_state._StateUnpickler, "load", load)
    with pytest.raises(StateError, match=error.__name__) as caught:
        decode(store_state.encode(make_state(participants=[A])))
    assert "quotes" not in str(caught.value)


def test_whatever_checking_raises_is_a_state_error():
    # A field named by a node whose address turned unhashable after it was made a key.
    node = NodeDesc("10.0.0.1", 1, 0)
    state = make_state(participants=[A])
    vars(state)[node] = 1
    object.__setattr__(node, "addr", ["unhashable"])
    with pytest.raises(StateError, match="TypeError"):
        validate(state)


def test_the_agents_decoder_refuses_the_same_bombs_in_time():
    # elasticjob_warm.statecheck reads torch's state through the same decode; outside its sync() a refusal is
    # the UnpicklingError torch expects.
    for data in (_state_pickle(participants=b"}" + _shared_tuples(32, 6) + b"K\x00s"),
                 _state_pickle(round=_dicts_filled_after_placement(20_000))):
        start = time.process_time()
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            statecheck._Pickle.loads(data)
        assert time.process_time() - start < 1.0
