"""The training's progress API (elasticjob_progress) against a real TCPStore, and the store's side that reads,
checks and reports it (elasticjob_store/progress.py, GET /v1/state)."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import elasticjob_progress
from elasticjob import store_reply
from elasticjob_progress.report import KEY, Report
from elasticjob_store import progress as store_progress
from elasticjob_store.control import Control
from helpers import wait_for


@pytest.fixture
def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


def env(tcp_store, **extra) -> dict[str, str]:
    return {"RANK": "0", "PET_RDZV_ENDPOINT": f"127.0.0.1:{tcp_store.port}", "POD_NAME": "train-worker-1",
            "TORCHELASTIC_RESTART_COUNT": "2", **extra}


def stored(tcp_store) -> dict | None:
    return json.loads(tcp_store.get(KEY)) if tcp_store.check([KEY]) else None


def test_rank0_reports_steps_and_checkpoints_through_the_jobs_store(tcp_store):
    progress = elasticjob_progress.Progress(environ=env(tcp_store), interval=0.05)
    progress.loading()
    progress.loaded(40)
    for n in range(41, 46):
        progress.step(n)
    progress.saved(45)
    report = wait_for(lambda: stored(tcp_store), 10, "a report with the save",
                      until=lambda r: r is not None and r["saved"] is not None)
    assert (report["pod"], report["restart"], report["firstStep"], report["step"]) == ("train-worker-1", 2, 41, 45)
    assert report["loaded"]["step"] == 40 and report["saved"]["step"] == 45
    assert report["loadingAt"] <= report["loaded"]["at"] <= report["firstStepAt"] <= report["stepAt"]
    progress.close()


@pytest.mark.parametrize("environ", [
    {"RANK": "1"},  # another rank: rank 0 alone reports
    {"RANK": "0", "PET_RDZV_ENDPOINT": ""},  # no store named
    {},  # not under torchrun at all
], ids=["rank-1", "no-endpoint", "outside-a-job"])
def test_a_no_op_where_it_has_nothing_to_report_to(tcp_store, environ):
    named = {"PET_RDZV_ENDPOINT": f"127.0.0.1:{tcp_store.port}"} if environ.get("RANK") == "1" else {}
    progress = elasticjob_progress.Progress(environ={**named, **environ}, interval=0.01)
    progress.step(1)
    progress.saved(1)
    progress.close()
    assert not progress.active and stored(tcp_store) is None


def test_local_rank_0_of_group_0_reports_where_rank_is_not_set():
    assert elasticjob_progress.reporting_rank({"GROUP_RANK": "0", "LOCAL_RANK": "0"})
    assert not elasticjob_progress.reporting_rank({"GROUP_RANK": "1", "LOCAL_RANK": "0"})


def test_a_store_that_is_gone_costs_the_steps_nothing():
    """Nothing listens at the endpoint: the reporter's connection fails in its own thread, steps stay cheap."""
    progress = elasticjob_progress.Progress(environ={"RANK": "0", "PET_RDZV_ENDPOINT": "127.0.0.1:1"},
                                            interval=0.01)
    started = time.perf_counter()
    for n in range(1000):
        progress.step(n)
    assert time.perf_counter() - started < 0.5
    assert progress.writes == 0
    progress.close(timeout=0.1)  # the reporter may still be trying to connect: a daemon, it goes with the test


def test_writes_are_throttled_to_one_per_interval(tcp_store):
    progress = elasticjob_progress.Progress(environ=env(tcp_store), interval=0.2)
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        progress.step(int((time.monotonic() - started) * 1000))
        progress.saved(1)
    progress.close()
    assert 1 <= progress.writes <= 7, progress.writes


def test_the_store_reports_the_latest_report_with_the_time_it_saw_it(tcp_store):
    clock = [1_900_000_000.0]
    control = Control(tcp_store, "run-1", 1, 2, clock=lambda: clock[0], log=lambda _line: None)
    progress = elasticjob_progress.Progress(environ=env(tcp_store), interval=0.01)
    progress.step(7)
    progress.close()
    control.poll()
    version = control.version
    seen = control.progress.describe(clock[0])
    assert seen["step"] == 7 and seen["pod"] == "train-worker-1" and seen["receivedAt"] == clock[0]
    view = store_reply.parse_progress(seen)
    assert view is not None and view.step == 7 and view.first_step == 7
    clock[0] += 0.4  # under two of the writer's intervals (0.25 s at the least): no stall yet
    control.poll()  # unchanged bytes: the time it was first seen stands, and nobody is woken
    assert control.progress.describe(clock[0])["receivedAt"] == seen["receivedAt"] and control.version == version


@pytest.mark.parametrize(("step_seconds", "interval", "stalls_after"), [
    (0.1, 0.5, 1.0),  # this writer's: two of its intervals
    (0.1, None, 2.0), (None, None, 2.0),  # a writer that does not say its interval wrote once a second
    (2.0, 0.5, 6.5), (2.0, None, 7.0),  # a slow step: three of them past one interval
    (None, 0.01, 0.5),  # read four times a second: a shorter interval counts as a quarter second
])
def test_a_report_unchanged_past_a_few_steps_is_a_stall_that_wakes_the_operator(tcp_store, step_seconds, interval,
                                                                                  stalls_after):
    clock = [1_900_000_000.0]
    control = Control(tcp_store, "run-1", 1, 2, clock=lambda: clock[0], log=lambda _line: None)

    def report(step: int) -> None:
        body = {"v": 1, "pod": "w-0", "step": step, "stepSeconds": step_seconds}
        if interval is not None:
            body["interval"] = interval
        tcp_store.set(KEY, json.dumps(body).encode())
        control.poll()

    report(7)
    version = control.version
    clock[0] += stalls_after - 0.01
    control.poll()
    assert not control.progress.describe(clock[0])["stalled"] and control.version == version
    clock[0] += 0.02
    control.poll()
    assert control.progress.describe(clock[0])["stalled"] and control.version == version + 1, "a long-poll answers"
    view = store_reply.parse_progress(control.progress.describe(clock[0]))
    assert view is not None and view.stalled
    report(8)  # stepping again: not stalled, and the operator hears of it at once too
    assert not control.progress.describe(clock[0])["stalled"] and control.version == version + 2


def test_a_report_that_never_named_a_step_is_no_stall(tcp_store):
    clock = [1_900_000_000.0]
    control = Control(tcp_store, "run-1", 1, 2, clock=lambda: clock[0], log=lambda _line: None)
    tcp_store.set(KEY, json.dumps({"v": 1, "pod": "w-0", "startedAt": clock[0]}).encode())
    control.poll()
    clock[0] += 600
    control.poll()
    assert not control.progress.describe(clock[0])["stalled"]


@pytest.mark.parametrize(("raw", "expected"), [
    (b"x" * 3000, None),  # too large: not read
    (b"[" * 2000, None),  # nested deeper than the parser goes (RecursionError): not read, nothing raised
    (b"not json", None),
    (b"[1, 2]", None),
    (json.dumps({"v": 2, "step": 1}).encode(), None),  # another version
    (json.dumps({"v": 1, "step": -1, "stepAt": 1e20, "pod": "a\nb", "saved": {"step": "x", "at": 1},
                 "stepSeconds": float("1e9")}).encode(),
     {"step": None, "stepAt": None, "pod": "ab", "saved": None, "stepSeconds": None}),
    (json.dumps({"v": 1, "step": True, "restart": 3}).encode(), {"step": None, "restart": 3}),  # true is no count
])
def test_the_store_checks_every_field_of_what_anyone_may_write(raw, expected):
    report = store_progress.check(raw)
    if expected is None:
        assert report is None
    else:
        assert {name: report[name] for name in expected} == expected


def test_the_operator_refuses_a_report_out_of_range_but_keeps_the_reply():
    reply = {"epoch": "ab12", "round": 1, "complete": True, "progress": {"step": -5, "pod": "x"}}
    view = store_reply.parse_state(json.dumps(reply).encode())
    assert view is not None and view.round == 1 and view.progress is None


def test_the_api_and_the_store_name_the_same_key_and_the_report_says_its_interval():
    assert KEY == store_progress.KEY == elasticjob_progress.KEY
    written = Report(pod="w-0", started_at=1.0, interval=elasticjob_progress.INTERVAL).wire(2.0)
    checked = store_progress.check(json.dumps(written).encode())
    assert checked is not None and checked["interval"] == elasticjob_progress.INTERVAL


def test_the_store_remembers_which_pod_reported_before_the_current_one_and_the_operator_reads_it():
    """Rank 0's pod lost: the survivors' new rank 0 may report before the operator books the loss; the store keeps
    the pod that reported before (ledger.held_rank0 still names the loss rank 0's)."""
    reader = store_progress.ProgressReader()
    for pod, at in (("w-1", 1.0), ("w-1", 2.0), ("w-0", 3.0)):
        reader.take(json.dumps(Report(pod=pod, started_at=at).wire(at)).encode(), at)
    described = reader.describe(3.0)
    assert described is not None and (described["pod"], described["previousPod"]) == ("w-0", "w-1")
    reader.take(json.dumps(Report(pod="w-0", started_at=4.0).wire(4.0)).encode(), 4.0)  # same pod again: kept
    reply = {"epoch": "ab12", "round": 1, "complete": True, "progress": reader.describe(4.0)}
    view = store_reply.parse_state(json.dumps(reply).encode())
    assert view is not None and view.progress is not None
    assert (view.progress.pod, view.progress.previous_pod) == ("w-0", "w-1")
