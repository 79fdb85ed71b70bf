"""The store's c10d server in pure Python (elasticjob_store/c10d_server.py) under torch's own TCPStore client.

Every call torch elastic and torch.distributed make, each run against torch's own server too where the answer is
torch's to define (the `endpoint` fixture), so that a test that passes on both pins torch's behaviour rather than
ours; raw messages answered byte for byte as torch's server answers them; a gloo process group and a torch
elastic rendezvous on top; then what only ours has: the handshake enforced, malformed messages and writes past
the bounds closing their client alone, the in-process API, the accept hook.

torch's bindings of list_keys and queue_len keep the GIL while they wait for the answer: called in this process
they would starve the server's thread, so they are called from a child process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from elasticjob_store import c10d
from elasticjob_store.c10d import Query
from elasticjob_store.c10d_server import C10dServer
from helpers import wait_for

TIMEOUT = timedelta(seconds=10)
CHILD_SECONDS = 120
# A torch client call that waits for an answer never sent blocks in C++, where pytest's usual (signal) timeout
# cannot reach: the thread method ends the run instead, with every thread's stack.
pytestmark = pytest.mark.timeout(CHILD_SECONDS, method="thread")


@dataclass
class Endpoint:
    name: str
    port: int
    server: C10dServer | None  # ours; None for torch's

    def waiters(self) -> int | None:
        """How many waiters ours holds (None for torch's, which does not say)."""
        if self.server is None:
            return None
        table = self.server.table
        return self.server.call(lambda: sum(len(waiting) for waiting in table.waiting.values()))

    def await_waiters(self, count: int) -> None:
        """Returns once `count` waiters are registered (at once with torch's server: the test then proves less)."""
        if self.server is not None:
            wait_for(self.waiters, 10, f"{count} waiters registered", until=lambda n: n == count, interval=0.01)


def client(port: int, timeout: timedelta = TIMEOUT) -> Any:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)


@pytest.fixture
def server() -> Iterator[C10dServer]:
    ours = C10dServer("127.0.0.1", 0, log=lambda line: None).start()
    yield ours
    ours.stop()


@pytest.fixture(params=["ours", "torch's"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    if request.param == "ours":
        ours = C10dServer("127.0.0.1", 0).start()
        yield Endpoint("ours", ours.port, ours)
        ours.stop()
    else:
        master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        yield Endpoint("torch's", master.port, None)
        del master


def background(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """fn(*args) on a daemon thread: torch's client blocks in C++ for an answer that never comes, where no
    timeout reaches it, and a daemon thread left blocked fails its test at the deadline, not the whole run."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - the test reads it
            done.set_exception(err)

    threading.Thread(target=run, daemon=True).start()
    return done


# Every call, on both servers.

def test_the_handshake_then_set_and_get_across_clients(endpoint):
    first, second = client(endpoint.port), client(endpoint.port)  # each validates and pings as it connects
    first.set("text", "a value")
    first.set("bytes", b"\x00\xff")
    assert second.get("text") == b"a value" and second.get("bytes") == b"\x00\xff"
    second.set("text", "")
    assert first.get("text") == b""


def test_compare_set_on_missing_and_present_keys(endpoint):
    store = client(endpoint.port)
    assert store.compare_set("missing", "expected", "desired") == b"expected"  # torch's answer; nothing written
    assert not store.check(["missing"])
    assert store.compare_set("missing", "", "first") == b"first"  # empty expected: created
    assert store.get("missing") == b"first"
    assert store.compare_set("missing", "stale", "second") == b"first"  # lost the race: the current value
    assert store.compare_set("missing", "first", "second") == b"second"
    assert store.get("missing") == b"second"


def test_add_counts_from_zero_and_reads_back_as_text(endpoint):
    store = client(endpoint.port)
    assert store.add("counter", 5) == 5
    assert store.add("counter", -7) == -2
    assert store.get("counter") == b"-2"
    store.set("set_first", "40")
    assert store.add("set_first", 2) == 42


def test_check_num_keys_and_delete_key(endpoint):
    store = client(endpoint.port)
    before = store.num_keys()
    store.set("a", "1")
    store.set("b", "2")
    assert store.num_keys() == before + 2
    assert store.check(["a", "b"]) and not store.check(["a", "c"])
    assert store.delete_key("a") is True
    assert store.delete_key("a") is False
    assert not store.check(["a"]) and store.num_keys() == before + 1


def test_append_creates_then_extends(endpoint):
    store = client(endpoint.port)
    store.append("log", "one,")
    store.append("log", b"two")
    assert store.get("log") == b"one,two"


def test_multi_set_and_multi_get(endpoint):
    store = client(endpoint.port)
    store.multi_set(["x", "y", "z"], ["1", "22", ""])
    assert store.multi_get(["z", "x", "y"]) == [b"", b"1", b"22"]


def test_a_wait_returns_when_another_client_sets_its_keys(endpoint):
    waiter, writer = client(endpoint.port), client(endpoint.port)
    waited = background(waiter.wait, ["first", "second"])
    endpoint.await_waiters(2)  # one per missing key
    writer.set("first", "1")
    endpoint.await_waiters(1)
    assert not waited.done()
    writer.add("second", 1)
    assert waited.result(timeout=10) is None


def test_a_wait_that_times_out_raises_and_the_client_goes_on(endpoint):
    store = client(endpoint.port)
    with pytest.raises(dist.DistStoreError, match="wait timeout"):  # after its CANCEL_WAIT was answered
        background(store.wait, ["never"], timedelta(milliseconds=200)).result(timeout=10)
    assert endpoint.waiters() in (0, None)  # the client's CANCEL_WAIT took it out
    store.set("after", "ok")
    assert store.get("after") == b"ok"


def test_get_waits_for_its_key(endpoint):
    reader, writer = client(endpoint.port), client(endpoint.port)
    got = background(reader.get, "later")
    endpoint.await_waiters(1)
    writer.set("later", "here")
    assert got.result(timeout=10) == b"here"


def test_a_prefix_store_over_the_client(endpoint):
    raw = client(endpoint.port)
    prefixed = dist.PrefixStore("job", raw)
    prefixed.set("key", "value")
    assert raw.get("job/key") == b"value"
    assert prefixed.add("n", 3) == 3 and prefixed.check(["key", "n"])
    assert prefixed.compare_set("key", "value", "next") == b"next"


def test_queues_push_pop_and_a_blocking_pop(endpoint):
    store, pusher = client(endpoint.port), client(endpoint.port)
    store.queue_push("q", "first")
    store.queue_push("q", "second")
    assert store.queue_pop("q") == b"first" and store.queue_pop("q", block=False) == b"second"
    with pytest.raises(dist.QueueEmptyError):
        store.queue_pop("q", block=False)
    popped = background(store.queue_pop, "q")
    endpoint.await_waiters(1)
    pusher.queue_push("q", "third")
    assert popped.result(timeout=10) == b"third"


def test_a_barrier_of_two_and_one_that_times_out(endpoint):
    first, second = client(endpoint.port), client(endpoint.port)
    arrived = background(first.barrier, "b", 2)
    endpoint.await_waiters(1)
    second.barrier("b", 2)
    assert arrived.result(timeout=10) is None
    with pytest.raises(dist.DistStoreError, match="barrier timeout"):
        background(first.barrier, "alone", 2, timedelta(milliseconds=200)).result(timeout=10)


LISTER = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=30))
    print(json.dumps({"keys": sorted(store.list_keys()), "queue": store.queue_len("q"),
                      "none": store.queue_len("nothing")}))
""")


def test_list_keys_and_queue_len_from_another_process(endpoint):
    store = client(endpoint.port)
    store.set("k1", "v")
    store.add("k2", 1)
    store.queue_push("q", "a")
    store.queue_push("q", "b")
    done = subprocess.run([sys.executable, "-c", LISTER, str(endpoint.port)], capture_output=True, text=True,
                          timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"keys": ["k1", "k2"], "queue": 2, "none": 0}


# Raw messages, answered byte for byte as torch's server answers them.

def message(query: Query, *fields: bytes) -> bytes:
    return bytes([query]) + b"".join(fields)


def key(name: str) -> bytes:
    return c10d.blob(name.encode())


def keys(*names: str) -> bytes:
    return struct.pack("=Q", len(names)) + b"".join(key(name) for name in names)


def connect(port: int, validate: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if validate:
        with contextlib.suppress(OSError):  # where the accept hook refuses, its close may come first
            sock.sendall(message(Query.VALIDATE, c10d.u32(c10d.MAGIC)))
    return sock


def read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def read_blob(sock: socket.socket) -> bytes:
    size = struct.unpack("=Q", read(sock, 8))[0]
    return read(sock, size)


# (message, how its answer is read): the answer read must be whole and nothing more must come.
RAW: list[tuple[bytes, Callable[[socket.socket], bytes] | None]] = [
    (message(Query.PING, c10d.u32(4242)), lambda s: read(s, 4)),
    (message(Query.SET, key("/a"), c10d.blob(b"1")), None),
    (message(Query.GET, key("/a")), read_blob),
    (message(Query.GET, key("/missing")), read_blob),
    (message(Query.COMPARE_SET, key("/cs"), c10d.blob(b"x"), c10d.blob(b"y")), read_blob),
    (message(Query.COMPARE_SET, key("/cs"), c10d.blob(b""), c10d.blob(b"y")), read_blob),
    (message(Query.COMPARE_SET, key("/cs"), c10d.blob(b"q"), c10d.blob(b"z")), read_blob),
    (message(Query.ADD, key("/n"), c10d.i64(-3)), lambda s: read(s, 8)),
    (message(Query.SET, key("/big"), c10d.blob(b"9223372036854775807")), None),
    (message(Query.ADD, key("/big"), c10d.i64(1)), lambda s: read(s, 8)),  # wraps, as int64 does
    (message(Query.SET, key("/loose"), c10d.blob(b" 12abc")), None),
    (message(Query.ADD, key("/loose"), c10d.i64(3)), lambda s: read(s, 8)),  # read as std::stoll reads
    (message(Query.CHECK, keys("/a", "/n")), lambda s: read(s, 1)),
    (message(Query.CHECK, keys("/a", "/nope")), lambda s: read(s, 1)),
    (message(Query.WAIT, keys("/a")), lambda s: read(s, 1)),
    (message(Query.WAIT, keys()), lambda s: read(s, 1)),
    (message(Query.CANCEL_WAIT), lambda s: read(s, 1)),
    (message(Query.GETNUMKEYS), lambda s: read(s, 8)),
    (message(Query.DELETE_KEY, key("/a")), lambda s: read(s, 8)),
    (message(Query.DELETE_KEY, key("/a")), lambda s: read(s, 8)),
    (message(Query.APPEND, key("/ap"), c10d.blob(b"1")), None),
    (message(Query.APPEND, key("/ap"), c10d.blob(b"2")), None),
    (message(Query.MULTI_SET, c10d.i64(2), key("/m1"), c10d.blob(b"1"), key("/m2"), c10d.blob(b"")), None),
    (message(Query.MULTI_GET, keys("/m2", "/ap", "/gone", "/m1")), lambda s: b"|".join(read_blob(s) for _ in "1234")),
    (message(Query.QUEUE_LEN, key("/q")), lambda s: read(s, 8)),
    (message(Query.QUEUE_POP, key("/q")), lambda s: read(s, 8)),
    (message(Query.QUEUE_PUSH, key("/q"), c10d.blob(b"item")), None),
    (message(Query.CHECK, keys("/q")), lambda s: read(s, 1)),  # a queue with an item counts as there
    (message(Query.GETNUMKEYS), lambda s: read(s, 8)),  # but not as a key
    (message(Query.QUEUE_LEN, key("/q")), lambda s: read(s, 8)),
    (message(Query.QUEUE_POP, key("/q")), lambda s: read(s, 8) + read_blob(s)),
    (message(Query.BARRIER, key("/bar"), c10d.i64(1)), lambda s: read(s, 1)),
    (message(Query.GET, key("/bar")), read_blob),
    (message(Query.GETNUMKEYS), lambda s: read(s, 8)),
    (message(Query.LIST_KEYS), lambda s: b"|".join(sorted(read_blob(s) for _ in range(
        struct.unpack("=q", read(s, 8))[0])))),
]


def raw_answers(port: int) -> list[bytes | None]:
    sock = connect(port)
    answers = []
    for data, answer in RAW:
        sock.sendall(data)
        answers.append(answer(sock) if answer else None)
    sock.sendall(message(Query.PING, c10d.u32(7)))  # nothing unread before it
    assert read(sock, 4) == c10d.u32(7)
    sock.close()
    return answers


def test_raw_answers_are_torchs_byte_for_byte(server):
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    theirs = raw_answers(master.port)
    assert raw_answers(server.port) == theirs
    assert theirs[4:7] == [b"x", b"y", b"y"]  # the facts the list rests on, as torch's server gave them


def test_messages_that_arrive_a_byte_at_a_time_are_read_whole(server):
    """As torch's client's _splitSet sends a SET: the key, then (a second later) the value."""
    sock = connect(server.port, validate=False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + message(Query.SET, key("/split"), c10d.blob(b"whole"))
    for byte in data + message(Query.GET, key("/split")):
        sock.sendall(bytes([byte]))
    assert read_blob(sock) == b"whole"


# Torch's process groups and rendezvous on top of ours.

GLOO_RANK = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    port, rank = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    dist.barrier()
    print(total.item())
    dist.destroy_process_group()
""")


def test_a_gloo_process_group_of_two_processes(server):
    ranks = [subprocess.Popen([sys.executable, "-c", GLOO_RANK, str(server.port), str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        outs = [rank.communicate(timeout=CHILD_SECONDS / 2) for rank in ranks]  # each gives up after 30 s
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], [err for _, err in outs]
    assert [out.split() for out, _ in outs] == [["3.0"], ["3.0"]]


def agent(port: int, run_id: str) -> Any:
    store = client(port)
    timeout = rdzv.RendezvousTimeout(join=timedelta(seconds=60), last_call=timedelta(milliseconds=100))
    return rdzv.DynamicRendezvousHandler.from_backend(run_id, store, C10dRendezvousBackend(store, run_id), 2, 2,
                                                     timeout=timeout)


def test_a_torch_elastic_rendezvous_of_two_agents(server):
    agents = [agent(server.port, "run") for _ in range(2)]
    try:
        rounds = [background(handler.next_rendezvous) for handler in agents]
        infos = [done.result(timeout=60) for done in rounds]
        assert sorted(info.rank for info in infos) == [0, 1]
        assert [info.world_size for info in infos] == [2, 2]
        infos[0].store.set("from rank", str(infos[0].rank))  # the round's store: a PrefixStore over ours
        assert infos[1].store.get("from rank") == str(infos[0].rank).encode()
        assert server.local().check(["torch.rendezvous.run"])  # the state torch wrote, where torch writes it
    finally:
        for handler in agents:
            handler.shutdown()


# What only ours does: the handshake enforced, malformed messages, the bounds.

def closed(sock: socket.socket) -> bool:
    """Whether the server closed the socket (waits up to the socket's timeout for it)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


MALFORMED = {
    "no VALIDATE first": message(Query.PING, c10d.u32(1)),
    "a wrong magic number": message(Query.VALIDATE, c10d.u32(c10d.MAGIC + 1)),
    "VALIDATE twice": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) * 2,
    "an unknown query type": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + bytes([99]),
    "a key longer than torch's": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + message(
        Query.GET, struct.pack("=Q", c10d.MAX_KEY_BYTES + 1)),
    "a value longer than torch's": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + message(
        Query.SET, key("/k"), struct.pack("=Q", c10d.MAX_VALUE_BYTES + 1)),
    "too many keys": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + message(
        Query.WAIT, struct.pack("=Q", c10d.MAX_REQUEST_KEYS + 1)),
    "ADD to a value that is not a number": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + message(
        Query.SET, key("/text"), c10d.blob(b"abc")) + message(Query.ADD, key("/text"), c10d.i64(1)),
    "a WAIT while one is pending": message(Query.VALIDATE, c10d.u32(c10d.MAGIC)) + message(
        Query.WAIT, keys("/never")) * 2,
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_closes_that_client_only(data):
    logged: list[str] = []
    ours = C10dServer("127.0.0.1", 0, log=logged.append).start()
    try:
        good = client(ours.port)
        good.set("before", "1")
        bad = connect(ours.port, validate=False)
        bad.sendall(data)
        assert closed(bad)
        assert good.get("before") == b"1"
        good.set("after", "2")
        assert client(ours.port).get("after") == b"2"
        assert ours.closed == 1 and len(logged) == 1 and "127.0.0.1" in logged[0]
        assert wait_for(lambda: ours.call(lambda: len(ours.table.waiting)), 10, "no waiter left",
                        until=lambda n: n == 0, interval=0.01) == 0
    finally:
        ours.stop()


def test_a_client_gone_mid_message_is_no_error(server):
    sock = connect(server.port)
    sock.sendall(message(Query.SET, key("/half"))[:-1])
    sock.close()
    store = client(server.port)
    store.set("next", "1")
    assert store.get("next") == b"1" and not store.check(["half"]) and server.closed == 0


def test_writes_past_the_bounds_close_their_writer_and_change_nothing():
    ours = C10dServer("127.0.0.1", 0, max_keys=3, max_bytes=4096, log=lambda line: None).start()
    try:
        writer = client(ours.port)
        for name in ("a", "b", "c"):
            writer.set(name, "1")
        writer.set("a", "overwritten")  # no new key: within the bounds
        writer.set("d", "1")  # a fourth key: SET has no answer, so its writer learns at its next call
        with pytest.raises(dist.DistError):
            writer.get("a")
        big = client(ours.port)
        with pytest.raises(dist.DistError):
            big.set("a", "x" * 4096)  # past the bytes
            big.get("a")
        reader = client(ours.port)
        assert reader.num_keys() == 3 and reader.get("a") == b"overwritten" and not reader.check(["d"])
        several = client(ours.port)
        with pytest.raises(dist.DistError):
            several.delete_key("c")
            several.multi_set(["c", "d"], ["1", "1"])  # two new keys where one fits: neither is written
            several.get("a")
        assert client(ours.port).multi_get(["a", "b"]) == [b"overwritten", b"1"]
        assert not client(ours.port).check(["c"]) and not client(ours.port).check(["d"])
        assert ours.closed == 3
    finally:
        ours.stop()


# The in-process API and the accept hook.

def test_the_local_store_sees_what_clients_wrote_and_clients_see_its_writes(server):
    store, local = client(server.port), server.local()
    store.set("agent", "wrote")
    assert local.get("agent") == b"wrote" and local.check(["agent"]) and not local.check(["agent", "nope"])
    local.set("store", b"wrote too")
    assert store.get("store") == b"wrote too"
    assert local.compare_set("agent", "wrote", "replaced") == b"replaced" and store.get("agent") == b"replaced"
    assert store.compare_set("store", "stale", "x") == local.compare_set("store", "stale", "y") == b"wrote too"
    assert local.add("n", 2) == 2 and store.add("n", 3) == 5 and local.add("n", 0) == 5
    assert local.num_keys() == store.num_keys() == 3
    assert local.delete_key("n") is True and not store.check(["n"]) and local.delete_key("n") is False


def test_a_local_get_waits_for_a_clients_write_and_times_out_alone(server):
    endpoint = Endpoint("ours", server.port, server)
    got = background(server.local(timeout=10).get, "later")
    endpoint.await_waiters(1)
    client(server.port).set("later", "v")
    assert got.result(timeout=10) == b"v"
    with pytest.raises(TimeoutError, match="never"):
        server.local(timeout=0.1).get("never")
    assert endpoint.waiters() == 0


def test_the_accept_hook_is_asked_before_a_byte_is_read():
    asked: list[str] = []
    verdict: list[bool | None] = [True]  # None: the hook fails

    async def accept(address: str) -> bool:
        asked.append(address)
        await asyncio.sleep(0)  # a coroutine, as the gate's is
        if verdict[0] is None:
            raise RuntimeError("the hook failed")
        return verdict[0]

    logged: list[str] = []
    ours = C10dServer("127.0.0.1", 0, accept=accept, log=logged.append).start()
    try:
        client(ours.port).set("admitted", "1")
        assert asked == ["127.0.0.1"]
        for verdict[0] in (False, None):
            refused = connect(ours.port)
            with contextlib.suppress(OSError):  # the refusal may come first
                refused.sendall(message(Query.SET, key("/refused"), c10d.blob(b"1")))
            assert closed(refused)
        assert len(asked) == 3 and "the hook failed" in logged[0]
        verdict[0] = True
        assert not client(ours.port).check(["refused"]) and ours.closed == 0
    finally:
        ours.stop()


# The codec's reading of counters, as std::stoll reads them (test_raw_answers_are_torchs_byte_for_byte shows two
# of these on torch's own server).

@pytest.mark.parametrize(("stored", "number"), [
    (b"12", 12), (b"-3", -3), (b"+7", 7), (b" \t\n\x0b\x0c\r5", 5), (b" 12abc", 12), (b"0x10", 0),
    (b"-9223372036854775808", -(2**63)),
])
def test_a_counter_reads_as_torchs_server_reads_it(stored, number):
    assert c10d.counter(stored) == number


@pytest.mark.parametrize("stored", [b"", b"abc", b"- 1", b"\x001", b"9223372036854775808"])
def test_a_counter_torchs_server_cannot_read_is_malformed(stored):
    with pytest.raises(c10d.Malformed):
        c10d.counter(stored)


def test_sums_wrap_as_int64():
    assert c10d.wrap64(2**63) == -(2**63) and c10d.wrap64(-(2**63) - 1) == 2**63 - 1 and c10d.wrap64(5) == 5
