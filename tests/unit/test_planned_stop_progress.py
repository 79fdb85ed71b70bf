"""Planned stops through the real parts: the store's Control picks the step from rank 0's report and writes it to
its TCPStore; every rank's elasticjob_progress learns the same step, saves, says so, and rank 0 reports the stop
once every rank did (elasticjob_progress/stop.py, elasticjob_store/stop.py)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import elasticjob_progress
from elasticjob import store_reply
from elasticjob_progress import stop as progress_stop
from elasticjob_progress.report import KEY
from elasticjob_store import stop as store_stop
from elasticjob_store.control import Control
from elasticjob_store.report import describe
from elasticjob_store.rounds import RoundTracker
from helpers import wait_for


@pytest.fixture
def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


class Rank:
    """One rank's Progress, under torchrun's environment, whose hold ends when the test says (not os._exit)."""

    def __init__(self, tcp_store, rank: int, world: int = 2, hold: float = 30.0, interval: float = 0.05) -> None:
        self.left: list[int] = []
        environ = {"RANK": str(rank), "WORLD_SIZE": str(world), "PET_RDZV_ENDPOINT": f"127.0.0.1:{tcp_store.port}",
                   "POD_NAME": f"train-worker-{rank}"}
        self.progress = elasticjob_progress.Progress(environ=environ, interval=interval, hold=hold,
                                                     leave=self.left.append)

    def stop_in_thread(self, step: int) -> threading.Thread:
        thread = threading.Thread(target=self.progress.stopped, args=(step,), daemon=True)
        thread.start()
        return thread


def report(tcp_store) -> dict | None:
    return json.loads(tcp_store.get(KEY)) if tcp_store.check([KEY]) else None


def test_the_keys_are_the_stores(tcp_store):
    assert (progress_stop.COUNT_KEY, progress_stop.STOP_PREFIX, progress_stop.DONE_PREFIX) == (
        store_stop.COUNT_KEY, store_stop.STOP_PREFIX, store_stop.DONE_PREFIX)


def test_two_ranks_learn_the_same_step_save_and_rank0_reports_the_stop(tcp_store):
    ranks = [Rank(tcp_store, 0), Rank(tcp_store, 1)]
    for n in range(1, 6):
        time.sleep(0.02)  # a training's step time: the report carries a step time
        for rank in ranks:
            rank.progress.step(n)
            assert not rank.progress.should_stop(n)
    seen = wait_for(lambda: report(tcp_store), 10, "rank 0's report that the script listens",
                    until=lambda r: r is not None and r["listens"] and r["step"] == 5 and r["stepSeconds"])
    control = Control(tcp_store, "run", 1, 2, log=lambda _: None)
    control.read_progress()
    reply = control.stop(time.time(), 0.5)
    assert reply.changed and reply.step is not None and reply.step > seen["step"]
    agreed = reply.step
    # Every rank learns it (its listener waits on the stop's key); none before its step, both at it.
    wait_for(lambda: [r.progress.stop_step() for r in ranks], 10, "both ranks learned the stop",
             until=lambda steps: steps == [agreed, agreed])
    assert [r.progress.should_stop(agreed - 1) for r in ranks] == [False, False]
    assert [r.progress.should_stop(agreed) for r in ranks] == [True, True]
    rank0 = ranks[0].stop_in_thread(agreed)
    time.sleep(0.3)  # rank 0 alone has saved: it must not report the stop yet
    assert (report(tcp_store) or {}).get("stopped") is None
    ranks[1].stop_in_thread(agreed)
    stopped = wait_for(lambda: report(tcp_store), 10, "the stop reported once both ranks stopped",
                       until=lambda r: r is not None and r["stopped"] is not None)
    assert stopped["stopped"]["step"] == agreed
    assert rank0.is_alive() and ranks[0].left == []  # held until the operator ends it
    for rank in ranks:
        rank.progress.close(1)
    wait_for(lambda: [r.left for r in ranks], 10, "both ranks left once closed", until=lambda left: all(left))


def test_a_process_that_began_after_the_stop_ignores_it(tcp_store):
    """A worker restarted from step 40's checkpoint finds the stop at 40 still in the store: not its own."""
    tcp_store.set(store_stop.stop_key(int(tcp_store.add(store_stop.COUNT_KEY, 1))), store_stop.record(1.0, 40, 2.0))
    restarted = Rank(tcp_store, 1)
    assert not restarted.progress.should_stop(41)
    wait_for(lambda: restarted.progress._listener.connected.is_set(), 10, "the listener read the store")
    assert restarted.progress.stop_step() is None and not restarted.progress.should_stop(42)
    earlier = Rank(tcp_store, 0)  # one that stepped before 40 stops at 40
    earlier.progress.should_stop(38)
    wait_for(lambda: earlier.progress.stop_step(), 10, "the earlier process learned the stop", until=lambda s: s == 40)
    for rank in (restarted, earlier):
        rank.progress.close(1)


@pytest.mark.parametrize(("report_", "received", "now", "margin", "expected"), [
    ({"step": 100, "stepSeconds": 0.1, "stepAt": 9.7, "sentAt": 9.9}, 10.0, 10.0, 2.0, 123),  # 0.2 s old when sent
    ({"step": 100, "stepSeconds": 0.1, "stepAt": 9.9, "sentAt": 9.9}, 10.0, 10.5, 2.0, 126),  # 0.5 s here
    ({"step": 100, "stepSeconds": 1.0, "stepAt": 0.0, "sentAt": 0.0}, 10.0, 99.0, 2.0, 113),  # stale: 10 s at most
    ({"step": 100, "stepSeconds": 2.0, "stepAt": 5.0, "sentAt": 5.0}, 5.0, 5.0, 0.0, 101),  # the next step
    ({"step": 100, "stepSeconds": None}, 10.0, 10.0, 2.0, None),  # one step seen: no step time
    ({"step": None, "stepSeconds": 0.1}, 10.0, 10.0, 2.0, None),
    (None, None, 10.0, 2.0, None),
], ids=["lag-when-sent", "lag-since-received", "stale-capped", "no-margin", "no-step-time", "no-step", "no-report"])
def test_the_stores_rule_for_the_step(report_, received, now, margin, expected):
    assert store_stop.agreed_step(report_, received, now, margin) == expected


def test_outside_a_job_nothing_stops(tcp_store):
    progress = elasticjob_progress.Progress(environ={"RANK": "0"}, hold=0.0, leave=pytest.fail)
    assert not progress.should_stop(1)
    progress.stopped(1)  # no stop applies: returns at once, never leaves


def test_the_operator_reads_the_stop_and_the_report_of_it_from_the_stores_state(tcp_store):
    """The store's GET /v1/state (report.describe) as the operator's client reads it: the stop the store wrote,
    and the training's word that it listens and stopped."""
    body = {"v": 1, "pod": "train-worker-0", "step": 123, "stepAt": 10.0, "stepSeconds": 0.1, "listens": True,
            "stopped": {"step": 123, "at": 11.0}, "sentAt": 11.0}
    tcp_store.set(KEY, json.dumps(body))
    control = Control(tcp_store, "run", 1, 2, clock=lambda: 12.0, log=lambda _: None)
    control.read_progress()
    control.stop_record = {"id": "5.000", "step": 123, "at": 6.0}
    reply = describe(None, RoundTracker(), now=12.0, epoch="ab12", run_id="run", min_nodes=1, max_nodes=2,
                     progress=control.progress.describe(control.now()), stop=control.stop_record)
    view = store_reply.parse_state(json.dumps(reply).encode())
    assert view is not None and (view.stop_id, view.stop_step) == ("5.000", 123)
    assert view.progress is not None and view.progress.listens and view.progress.stopped_step == 123


def test_the_stops_report_goes_out_at_once_past_the_interval(tcp_store):
    """Every rank holds until the operator reads it: waiting out the reporter's interval (1 s by default) was
    training time lost at every planned stop."""
    rank = Rank(tcp_store, 0, world=1, interval=30.0)  # after the first write, one every 30 s at most
    rank.progress.step(1)
    rank.progress.should_stop(1)
    wait_for(lambda: report(tcp_store), 10, "the first report", until=lambda r: r is not None)
    # The store's stop, as Control.stop writes it (its step from a report this interval holds back).
    tcp_store.add(store_stop.COUNT_KEY, 1)
    tcp_store.set(store_stop.stop_key(1), store_stop.record(time.time(), 1, time.time()))
    wait_for(lambda: rank.progress.stop_step(), 10, "the rank learned the stop", until=lambda s: s == 1)
    rank.stop_in_thread(1)
    stopped = wait_for(lambda: report(tcp_store), 5, "the stop reported within the interval",
                       until=lambda r: r is not None and r.get("stopped") is not None)
    assert stopped["stopped"]["step"] == 1
    rank.progress.close(1)
