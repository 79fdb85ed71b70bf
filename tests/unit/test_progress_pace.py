"""Each rank's pace (elasticjob_progress/pace.py) against a real TCPStore and real torch modules, the store's side
that reads and checks it (elasticjob_store/pace.py, GET /v1/state), and the operator's reading of the reply."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import elasticjob_progress
from elasticjob import store_reply
from elasticjob_progress import pace as worker_pace
from elasticjob_store import pace as store_pace
from elasticjob_store.control import Control
from elasticjob_store.report import describe
from helpers import wait_for


@pytest.fixture
def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


class Busy(torch.nn.Module):
    """A model whose forward takes at least `seconds`: a rank on a slow node."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deadline = time.perf_counter() + self.seconds
        while time.perf_counter() < deadline:
            pass  # compute, not a wait: the rank's own work takes this long
        return self.linear(x)


class Wrapper(torch.nn.Module):
    """Holds its model as DistributedDataParallel does (.module), and does more around it."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)  # DDP's own work before the forward (a broadcast of buffers): not the rank's pace
        return self.module(x)


def env(tcp_store, rank: int, world: int = 2) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "PET_RDZV_ENDPOINT": f"127.0.0.1:{tcp_store.port}",
            "POD_NAME": f"train-worker-{rank}"}


def stored(tcp_store, rank: int) -> dict | None:
    key = worker_pace.key(rank)
    return json.loads(tcp_store.get(key)) if tcp_store.check([key]) else None


def run(progress: elasticjob_progress.Progress, model: torch.nn.Module, forwards: int) -> None:
    for _ in range(forwards):
        model(torch.zeros(2, 4))


def test_every_rank_reports_the_median_of_its_own_forwards_without_the_wrappers_time(tcp_store):
    ranks = [elasticjob_progress.Progress(environ=env(tcp_store, r)) for r in range(2)]
    models = [Wrapper(Busy(0.002)), Wrapper(Busy(0.03))]
    for progress, model in zip(ranks, models, strict=True):
        progress.watch(model, interval=0.05)
        run(progress, model, worker_pace.MIN_SAMPLES + 2)
    fast = wait_for(lambda: stored(tcp_store, 0), 10, "rank 0's pace")
    slow = wait_for(lambda: stored(tcp_store, 1), 10, "rank 1's pace: every rank reports, not rank 0 alone")
    assert (fast["pod"], fast["rank"], fast["world"], slow["pod"]) == ("train-worker-0", 0, 2, "train-worker-1")
    assert 0.002 <= fast["seconds"] < 0.02, "the wrapper's 20 ms are not the rank's forward"
    assert 0.03 <= slow["seconds"] < 0.05
    for progress in ranks:
        progress.close()


def test_nothing_is_written_before_a_few_forwards_nor_outside_a_job(tcp_store):
    progress = elasticjob_progress.Progress(environ=env(tcp_store, 1))
    model = Busy(0.0)
    progress.watch(model, interval=0.01)
    run(progress, model, worker_pace.MIN_SAMPLES - 1)
    assert progress._pace is not None and progress._pace.report() is None
    progress.close()
    assert stored(tcp_store, 1) is None
    outside = elasticjob_progress.Progress(environ={})
    outside.watch(model)
    assert outside._pace is None


class FakeEvent:
    """torch.cuda.Event's part the CUDA timer uses: recorded at a time, passed once the GPU got there."""

    def __init__(self, gpu: list[float], passed: list[float]) -> None:
        self.gpu, self.passed, self.at = gpu, passed, None

    def record(self) -> None:
        self.at = self.gpu[0]

    def query(self) -> bool:
        return self.at is not None and self.at <= self.passed[0]

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0  # milliseconds, as CUDA's


def test_on_a_gpu_a_forward_is_read_once_its_end_passed_on_the_device_not_when_the_cpu_queued_it():
    gpu, passed = [0.0], [0.0]
    timer = worker_pace.CudaTimer(lambda: FakeEvent(gpu, passed))
    timer.begin()
    gpu[0] = 0.25
    assert timer.end() is None  # the CPU only queued the kernels
    timer.begin()
    gpu[0] = 0.75
    timer.end()
    assert timer.done() == []
    passed[0] = 0.5
    assert timer.done() == [0.25]
    passed[0] = 1.0
    assert timer.done() == [0.5]


def test_the_api_and_the_store_name_the_same_keys():
    assert worker_pace.KEY_PREFIX == store_pace.KEY_PREFIX and worker_pace.key(3) == store_pace.key(3)


def report(index: int, seconds: float, *, pod: str | None = None, world: int = 3, **extra) -> bytes:
    body = {"v": 1, "pod": pod if pod is not None else f"train-worker-{index}", "rank": index, "world": world, "seconds": seconds,
            "samples": 16, "sentAt": 1.0, **extra}
    return json.dumps(body).encode()


@pytest.mark.parametrize(("raw", "why"), [
    (b"x" * 600, "too large"), (b"not json", "not JSON"), (b"[1]", "not an object"),
    (report(0, 0.1, v=2), "another version"),
    (report(0, 0.1, pod=""), "no pod"), (report(0, 0.1, pod="a\nb"), "a pod name that is not printable"),
    (report(3, 0.1, world=3), "a rank outside its world"), (report(0, 0.1, world=5000), "a world past the cap"),
    (report(0, 0.0), "no time"), (report(0, float("inf")), "an infinite time"), (report(0, 1e9), "past an hour"),
    (report(0, 0.1, **{"rank": True}), "true is no rank"), (report(0, 0.1, samples=0), "no samples"),
])
def test_the_store_refuses_a_report_with_any_field_wrong(raw, why):
    assert store_pace.check(raw) is None, why


def test_the_store_reads_as_many_ranks_as_the_world_names_keeps_each_pods_slowest_and_forgets_stale_ones():
    reader = store_pace.PaceReader()
    assert list(reader.ranks()) == [0]
    reader.take(0, report(0, 0.02), 100.0)
    assert list(reader.ranks()) == [0, 1, 2]
    reader.take(1, report(1, 0.05, pod="train-worker-0"), 100.0)  # a second process of the same pod
    reader.take(2, report(2, 0.021), 103.0)
    assert reader.by_pod(104.0) == [{"pod": "train-worker-0", "seconds": 0.05, "ranks": 2},
                                    {"pod": "train-worker-2", "seconds": 0.021, "ranks": 1}]
    assert reader.landmark(104.0) == "train-worker-0"
    reader.take(1, report(1, 0.05, pod="train-worker-1"), 100.0)  # the wrong rank under the key: dropped
    reader.take(1, report(0, 0.05), 100.0)
    assert [p["pod"] for p in reader.by_pod(104.0)] == ["train-worker-0", "train-worker-2"]
    reader.forget_stale(100.0 + store_pace.STALE_AFTER + 1)
    assert [p["pod"] for p in reader.by_pod(100.0 + store_pace.STALE_AFTER + 1)] == ["train-worker-2"]


def test_a_slow_pod_wakes_the_operators_long_poll_and_reaches_its_view(tcp_store):
    clock = [1_900_000_000.0]
    control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lambda _line: None)
    for rank, seconds in enumerate((0.02, 0.021, 0.022)):
        tcp_store.set(store_pace.key(rank), report(rank, seconds))
    control.poll()
    version = control.version
    tcp_store.set(store_pace.key(0), report(0, 0.06, sentAt=2.0))
    clock[0] += 0.25
    control.poll()
    assert control.version == version, "read every 2 s, not at each tick"
    clock[0] += store_pace.READ_EVERY
    control.poll()
    assert control.version == version + 1, "a pod 1.5 times slower than the others answers the long-poll"
    body = describe(None, control.tracker, now=clock[0], epoch="ab", run_id="run-1", min_nodes=1, max_nodes=3,
                    pace=control.pace.by_pod(clock[0]))
    view = store_reply.parse_state(json.dumps(body).encode())
    assert view is not None and [(p.pod, p.seconds) for p in view.pace] == [
        ("train-worker-0", 0.06), ("train-worker-1", 0.021), ("train-worker-2", 0.022)]


def test_the_operator_leaves_out_a_pace_out_of_range_but_keeps_the_reply():
    reply = {"epoch": "ab12", "round": 1, "complete": True,
             "pace": [{"pod": "w-0", "seconds": -1, "ranks": 1}, {"pod": "w-1", "seconds": 0.5, "ranks": 1}, "x"]}
    view = store_reply.parse_state(json.dumps(reply).encode())
    assert view is not None and [p.pod for p in view.pace] == ["w-1"]


def test_a_report_from_before_the_round_formed_is_dropped_and_does_not_come_back_unchanged():
    """A slow pod replaced by one of the same name: the old process's last report, still under its rank's key,
    must not make the new pod look slow (seen on real nodes: SlowWorker again right after the replacement)."""
    reader = store_pace.PaceReader()
    reader.take(0, report(0, 0.02, world=2), 100.0)
    reader.take(1, report(1, 0.2, world=2), 100.0)
    reader.forget_stale(103.0, round_began=102.0)  # the group restarted with the replacement at 102
    assert reader.by_pod(103.0) == []
    reader.take(1, report(1, 0.2, world=2), 105.0)  # the same bytes read again: still the old process's
    assert reader.by_pod(105.0) == []
    reader.take(1, report(1, 0.021, world=2, sentAt=4.0), 106.0)  # the new process writes
    assert reader.by_pod(106.0) == [{"pod": "train-worker-1", "seconds": 0.021, "ranks": 1}]
    reader.take(0, report(0, 0.02, world=2, sentAt=9.0), 200.0)
    assert [p["pod"] for p in reader.by_pod(200.0)] == ["train-worker-0"]
    reader.forget_stale(200.0 + store_pace.STALE_AFTER + 1)
    reader.take(0, report(0, 0.02, world=2, sentAt=9.0), 200.0 + store_pace.STALE_AFTER + 2)
    assert [p["pod"] for p in reader.by_pod(200.0 + store_pace.STALE_AFTER + 2)] == [], \
        "a writer gone quiet stays gone"


def test_the_reports_standing_when_a_round_forms_are_dropped_at_once_and_new_ones_taken(tcp_store):
    """The store reads every key at the poll that sees a new round: what stands then was written by the processes
    the round's restart ended (a slow pod's, under the name its replacement now has)."""
    from store_states import A, B, make_state

    from elasticjob_store import compat
    from elasticjob_store.state import encode, state_key

    clock = [1_900_000_000.0]
    control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lambda _line: None,
                      verdict=compat.Verdict("", True, "proven"))
    tcp_store.set(state_key("run-1"), encode(make_state(round=1, complete=True, participants=(A, B))))
    tcp_store.set(store_pace.key(0), report(0, 0.02, world=2))
    tcp_store.set(store_pace.key(1), report(1, 0.2, world=2))
    control.poll()
    assert [p["pod"] for p in control.pace.by_pod(clock[0])] == [], "read as the round formed: dropped"
    clock[0] += 0.25
    tcp_store.set(store_pace.key(1), report(1, 0.2, world=2, sentAt=2.0))  # a process of round 1 writes
    control.poll()
    assert control.pace.by_pod(clock[0]) == [], "read every 2 s, not at each tick"
    clock[0] += store_pace.READ_EVERY
    control.poll()
    assert [p["pod"] for p in control.pace.by_pod(clock[0])] == ["train-worker-1"]
    tcp_store.set(state_key("run-1"), encode(make_state(round=2, complete=True, participants=(A, B))))
    clock[0] += 0.25
    control.poll()  # round 2: read at once, and what stood dropped
    assert control.pace.by_pod(clock[0]) == []


def test_a_process_s_first_forwards_are_left_out():
    rank = worker_pace.Pace(lambda: None, rank=0, world=1, pod="w")
    for seconds in (5.0, 5.0, *[0.01] * worker_pace.MIN_SAMPLES):
        rank.took(seconds)
    report_ = rank.report()
    assert report_ is not None and report_["seconds"] == 0.01 and report_["samples"] == worker_pace.MIN_SAMPLES
