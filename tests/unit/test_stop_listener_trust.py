"""A planned stop's keys are the store's, but anyone who reaches its port may write them (elasticjob_progress/
stop.py): a rank's listener on a real TCPStore on the loopback takes no forged record for a stop, is not blinded
by adds to the count, never replays a stop it took, and a hold that nobody ends leaves with STOP_EXPIRED_EXIT."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import elasticjob_progress
from elasticjob import agent_messages
from elasticjob_progress import stop as progress_stop
from elasticjob_store import stop as store_stop
from helpers import wait_for


@pytest.fixture
def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


@pytest.fixture
def listener(tcp_store, monkeypatch):
    # A listener that had to reconnect (an error raised while it read) would come back only after the test.
    monkeypatch.setattr(progress_stop, "RECONNECT", 60.0)
    stopping = threading.Event()
    client = lambda: dist.TCPStore("127.0.0.1", tcp_store.port, is_master=False,  # noqa: E731
                                   timeout=timedelta(seconds=10))
    listening = progress_stop.Listener(client, stopping)
    wait_for(lambda: listening.connected.is_set(), 10, "the listener read the store")
    yield listening
    stopping.set()
    listening.join(5)


def real_stop(tcp_store, step: int, requested_at: float) -> int:
    """A stop as the store's Control.stop writes it: under the count its own add returned."""
    n = int(tcp_store.add(store_stop.COUNT_KEY, 1))
    tcp_store.set(store_stop.stop_key(n), store_stop.record(requested_at, step, time.time()))
    return n


def forged(tcp_store, body: bytes) -> int:
    n = int(tcp_store.add(store_stop.COUNT_KEY, 1))
    tcp_store.set(store_stop.stop_key(n), body)
    return n


DEEP = b"[" * 100_000
VALID = store_stop.record(1.0, 7, 2.0)


@pytest.mark.parametrize("raw", [
    b"not json", b"\xff\xfe", DEEP, VALID + b" " * progress_stop.MAX_BYTES, b'{"v": 1, "id": "x", "step": -1}',
    b'{"v": 1, "id": "x", "step": true}', b'{"v": 2, "id": "x", "step": 1}', b'[1]',
], ids=["text", "bytes", "deep", "oversize", "negative", "bool", "version", "list"])
def test_what_is_not_the_stores_record_is_no_stop(raw):
    assert progress_stop.parse(raw) is None
    assert progress_stop.parse(VALID) == ("1.000", 7)


def test_deep_nesting_under_the_size_cap_is_no_stop_whatever_the_parser_raises(monkeypatch):
    monkeypatch.setattr(progress_stop, "MAX_BYTES", len(DEEP))
    assert progress_stop.parse(DEEP) is None  # json raises RecursionError here: no stop, no raise


@pytest.mark.parametrize("body", [b"not json", DEEP, VALID + b" " * progress_stop.MAX_BYTES],
                         ids=["text", "deep", "oversize"])
def test_a_forged_record_is_read_once_as_no_stop_and_the_next_real_stop_is_taken(tcp_store, listener, body):
    n = forged(tcp_store, body)
    wait_for(lambda: listener.read, 5, "the listener read the forged key", until=lambda read: read == n)
    assert listener.latest is None
    real_stop(tcp_store, 12, 5.0)
    assert wait_for(lambda: listener.latest, 5, "the real stop taken", until=bool) == ("5.000", 12)


def test_adds_to_the_count_do_not_blind_the_listener_to_the_next_real_stop(tcp_store, listener):
    tcp_store.add(store_stop.COUNT_KEY, 1000)  # no key under any of these counts: a get would wait its timeout
    wait_for(lambda: listener.latest, 1, "a listener that stays alive", until=lambda latest: latest is None)
    n = real_stop(tcp_store, 30, 6.0)
    assert n == 1001
    assert wait_for(lambda: listener.latest, 5, "the real stop taken", until=bool) == ("6.000", 30)
    assert listener.read == 1001


def test_a_count_moved_back_does_not_replay_a_stop_taken_and_the_stores_next_stop_is_taken(tcp_store, listener):
    real_stop(tcp_store, 10, 1.0)
    wait_for(lambda: listener.latest, 5, "the first stop", until=lambda latest: latest == ("1.000", 10))
    real_stop(tcp_store, 20, 2.0)
    wait_for(lambda: listener.latest, 5, "the second stop", until=lambda latest: latest == ("2.000", 20))
    tcp_store.add(store_stop.COUNT_KEY, -1)  # back to the first stop's key
    wait_for(lambda: listener.read, 5, "the listener followed the count back", until=lambda read: read == 1)
    assert listener.latest == ("2.000", 20)
    assert real_stop(tcp_store, 40, 3.0) == 2  # the store's next stop, under the count its add returned
    wait_for(lambda: listener.latest, 5, "the third stop", until=lambda latest: latest == ("3.000", 40))


def test_a_hold_nobody_ends_leaves_with_the_stop_expired_code_and_says_so(tcp_store, capfd):
    left: list[int] = []
    environ = {"RANK": "0", "WORLD_SIZE": "1", "PET_RDZV_ENDPOINT": f"127.0.0.1:{tcp_store.port}",
               "POD_NAME": "train-worker-0"}
    progress = elasticjob_progress.Progress(environ=environ, interval=0.05, hold=0.5, leave=left.append)
    progress.step(1)
    progress.should_stop(1)
    forged(tcp_store, store_stop.record(time.time(), 2, time.time()))  # nobody will end this stop
    wait_for(lambda: progress.stop_step(), 5, "the rank learned the stop", until=lambda step: step == 2)
    assert progress.should_stop(2)
    progress.stopped(2)  # holds `hold` seconds: the operator never ends it
    assert left == [elasticjob_progress.STOP_EXPIRED_EXIT]
    assert "(StopExpired, not charged)" in capfd.readouterr().err
    progress.close(1)


def test_a_hold_closed_meanwhile_leaves_with_exit_code_1(tcp_store):
    left: list[int] = []
    environ = {"RANK": "0", "WORLD_SIZE": "1", "PET_RDZV_ENDPOINT": f"127.0.0.1:{tcp_store.port}"}
    progress = elasticjob_progress.Progress(environ=environ, interval=0.05, hold=30.0, leave=left.append)
    progress.step(1)
    progress.should_stop(1)
    forged(tcp_store, store_stop.record(time.time(), 2, time.time()))
    wait_for(lambda: progress.stop_step(), 5, "the rank learned the stop", until=lambda step: step == 2)
    holding = threading.Thread(target=progress.stopped, args=(2,), daemon=True)
    holding.start()
    progress.close(1)
    holding.join(5)
    assert left == [1]


def test_the_agents_sigterm_reads_deep_json_as_no_stop_and_no_report():
    """elasticjob_warm/evicted.py reads the same keys when its pod is told to go: no RecursionError out of it."""
    from elasticjob_warm import evicted

    assert evicted.parse_stop(DEEP) is None and evicted.parse_report(DEEP) is None


def test_the_operator_knows_the_stop_expired_code():
    assert agent_messages.STOP_EXPIRED_EXIT == elasticjob_progress.STOP_EXPIRED_EXIT


# --- the store's side: the counts it reads and writes (elasticjob_store/stop.py) ----------------------------------


@pytest.mark.parametrize("raw, expected", [
    (b"12", 12), (b"-3", -3), (b"0", 0), (b"x", None), (b"", None), (b" 1", None), (b"1" * 20, None),
    (b"9223372036854775808", None), (b"9223372036854775807", 2**63 - 1),
])
def test_a_count_is_read_as_the_stores_add_writes_it(raw, expected):
    assert store_stop.parse_count(raw) == expected


def test_a_value_that_is_no_count_is_read_without_losing_the_connection_and_replaced_by_the_next_stop(tcp_store):
    """A TCPStore's add to such a value closes the adder's connection for good: the store reads and writes its
    counts with get and compare_set instead, and its next stop makes the count one the ranks can add to again."""
    client = dist.TCPStore("127.0.0.1", tcp_store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set(store_stop.REQUEST_KEY, b"x")
    client.set(store_stop.COUNT_KEY, b"not a count")
    assert store_stop.count(client, store_stop.REQUEST_KEY) is None
    assert store_stop.count(client, "elasticjob.nothing-here") == 0
    n = store_stop.next_number(client)  # the connection still answers
    assert n == 1 and client.add(store_stop.COUNT_KEY, 0) == 1
    client.set(store_stop.stop_key(n), store_stop.record(8.0, 80, time.time()))
    assert store_stop.next_number(client) == 2 and store_stop.count(client, store_stop.COUNT_KEY) == 2
    tcp_store.add(store_stop.COUNT_KEY, 1000)  # adds of others: the next number counts on from them
    assert store_stop.next_number(client) == 1003
