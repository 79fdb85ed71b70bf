"""Per-job reconcile loops: events coalesce, a failing reconcile does not end the loop, forget stops it."""

from __future__ import annotations

import asyncio
import functools
import logging

import pytest

import helpers
from elasticjob.controller.loops import FOLLOW_UPS, Failed, JobLoops, wait_woken

LOG = logging.getLogger("test")


until = functools.partial(helpers.until, timeout=2.0)


def test_events_during_a_reconcile_coalesce_into_one_more_reconcile():
    async def scenario():
        seen, gate, state = [], asyncio.Event(), {"v": 1}

        async def reconcile(loop):
            seen.append(state["v"])
            if len(seen) == 1:
                await gate.wait()
            return 60.0

        loops = JobLoops(reconcile, LOG)
        loops.ensure("k")
        await until(lambda: seen == [1])
        for v in (2, 3, 4):  # three events while the first reconcile runs
            state["v"] = v
            loops.ensure("k")
        gate.set()
        await until(lambda: len(seen) == 2)
        await asyncio.sleep(0.05)
        assert seen == [1, 4], "one reconcile with the latest state, not one per event"
        await loops.stop_all()
    asyncio.run(scenario())


def test_a_loop_keeps_its_memory_between_runs():
    async def scenario():
        runs = []

        async def reconcile(loop):
            loop.memory = (loop.memory or 0) + 1
            runs.append(loop.memory)
            return 60.0

        loops = JobLoops(reconcile, LOG)
        loops.ensure("k")
        await until(lambda: runs == [1])
        loops.wake("k")
        await until(lambda: runs == [1, 2])
        await loops.stop_all()
    asyncio.run(scenario())


def test_a_failing_reconcile_is_retried_and_other_jobs_go_on():
    async def scenario():
        calls = {"bad": 0, "good": 0}

        async def reconcile(loop):
            calls[loop.key] += 1
            if loop.key == "bad":
                raise RuntimeError("boom")
            return 60.0

        loops = JobLoops(reconcile, LOG)
        loops.ensure("bad")
        loops.ensure("good")
        await until(lambda: calls["bad"] == 1 and calls["good"] == 1)
        loops.wake("bad")
        await until(lambda: calls["bad"] == 2)
        await loops.stop_all()
        assert len(loops) == 0
    asyncio.run(scenario())


def test_forget_stops_the_loop():
    async def scenario():
        calls = []

        async def reconcile(loop):
            calls.append(1)
            return 0.01

        loops = JobLoops(reconcile, LOG)
        loops.ensure("k")
        await until(lambda: len(calls) >= 2)  # the requested delay wakes it by itself
        await loops.forget("k")
        stopped_at = len(calls)
        await asyncio.sleep(0.1)
        assert len(calls) == stopped_at and len(loops) == 0 and "k" not in loops
        loops.wake("k")  # waking a forgotten job is harmless
    asyncio.run(scenario())


def test_a_job_deleted_and_created_again_at_once_gets_a_loop_of_its_own():
    """The watch hands over the old job's DELETED and the new job's ADDED before the forget runs (soak, seed
    514993: the new job was never reconciled)."""
    async def scenario():
        runs: list[object] = []

        async def reconcile(loop):
            runs.append(loop)
            return 60.0

        loops = JobLoops(reconcile, LOG)
        old = loops.ensure("k")
        await until(lambda: runs == [old])
        ending = asyncio.ensure_future(loops.forget("k"))  # spawned, as watch.dispatch does
        new = loops.ensure("k")
        await ending
        await until(lambda: runs == [old, new])
        assert new is not old and "k" in loops
        await loops.stop_all()
    asyncio.run(scenario())


def test_a_loop_forgotten_just_as_it_was_woken_ends():
    """A pod's event wakes the job, its DELETED forgets it, in one go: the cancellation lands on a wait whose wake
    has just come (asyncio.wait_for on Python 3.11 returned normally then, and the loop lived on)."""
    async def scenario():
        runs: list[int] = []

        async def reconcile(loop):
            runs.append(1)
            return 60.0

        loops = JobLoops(reconcile, LOG)
        loops.ensure("k")
        await until(lambda: runs == [1])
        await asyncio.sleep(0.01)  # the loop waits to be woken
        loops.wake("k")
        await asyncio.wait_for(loops.forget("k"), 2.0)
        await asyncio.sleep(0.05)
        assert runs == [1]
    asyncio.run(scenario())


def test_the_new_loop_of_a_name_starts_once_the_old_loop_has_ended():
    async def scenario():
        events: list[str] = []
        release = asyncio.Event()

        async def reconcile(loop):
            events.append(f"start {len(events)}")
            if len(events) == 1:
                try:
                    await release.wait()
                finally:  # a cancelled pass still finishes what it had in flight (a thread's API call)
                    await asyncio.sleep(0.05)
                    events.append("old ended")
            return 60.0

        loops = JobLoops(reconcile, LOG)
        loops.ensure("k")
        await until(lambda: events == ["start 0"])
        ending = asyncio.ensure_future(loops.forget("k"))
        loops.ensure("k")
        await ending
        await until(lambda: len(events) == 3)
        assert events == ["start 0", "old ended", "start 2"]
        await loops.stop_all()
    asyncio.run(scenario())


def test_reconciles_in_flight_are_bounded_and_the_waiting_ones_run_when_a_slot_frees():
    async def scenario():
        running, done, gate = set(), [], asyncio.Event()

        async def reconcile(loop):
            running.add(loop.key)
            peak.append(len(running))
            await gate.wait()
            running.discard(loop.key)
            done.append(loop.key)
            return 60.0

        peak: list[int] = []
        loops = JobLoops(reconcile, LOG, concurrency=2)
        for key in range(5):
            loops.ensure(key)
        await until(lambda: len(running) == 2)
        await asyncio.sleep(0.05)  # give a third one the chance to start, were it allowed to
        assert len(running) == 2
        gate.set()
        await until(lambda: len(done) == 5)
        assert max(peak) == 2
        await loops.stop_all()
    asyncio.run(scenario())


def test_stopping_starts_no_pass_in_a_slot_the_stopped_loops_free():
    async def scenario():
        started, gate = [], asyncio.Event()

        async def reconcile(loop):
            started.append(loop.key)
            await gate.wait()
            return 60.0

        loops = JobLoops(reconcile, LOG, concurrency=1)
        loops.ensure("holds the slot")
        await until(lambda: started == ["holds the slot"])
        loops.ensure("waits for it")
        await loops.stop_all()
        assert started == ["holds the slot"] and len(loops) == 0
    asyncio.run(scenario())


class Clock:
    """The loops' wait, on a clock the test moves: every wait is recorded, and time passes at once unless the wait
    is `hold` or more (then only a wake ends it)."""

    def __init__(self, hold: float = 3600.0) -> None:
        self.waits: list[float] = []
        self.hold = hold

    async def wait(self, wake: asyncio.Event, delay: float) -> None:
        self.waits.append(delay)
        if delay >= self.hold:
            await wake.wait()


def test_a_failing_reconcile_is_retried_on_the_schedule_which_a_success_starts_again():
    async def scenario():
        outcomes = ["crash", "api"] * 6 + ["ok", "api", "crash", "ok"]

        async def reconcile(loop):
            outcome = outcomes.pop(0)
            if outcome == "crash":
                raise RuntimeError("boom")  # unexpected: logged with its traceback
            if outcome == "api":
                raise Failed("503 Service Unavailable")  # expected: logged as a warning
            return 3600.0

        clock = Clock()
        loops = JobLoops(reconcile, LOG, wait=clock.wait)
        loops.ensure("k")
        await until(lambda: len(clock.waits) == 13)
        assert clock.waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300, 3600]
        loops.wake("k")  # news: the next failures back off from the first step again
        await until(lambda: len(clock.waits) == 16)
        assert clock.waits[13:] == [1, 2, 3600] and not outcomes
        await loops.stop_all()
    asyncio.run(scenario())


def test_a_wake_runs_a_backing_off_job_at_once():
    async def scenario():
        calls, waits = [], []

        async def reconcile(loop):
            calls.append(loop.failures)
            raise Failed("500 Internal Server Error")

        async def slow(wake, delay):  # every step an hour: only a wake can end it within the test
            waits.append(delay)
            await wait_woken(wake, delay * 3600)

        loops = JobLoops(reconcile, LOG, wait=slow)
        loops.ensure("k")
        await until(lambda: waits == [1])
        loops.ensure("k")  # a watch event
        await until(lambda: waits == [1, 2])
        assert calls == [0, 1], "one run per wake, the failures counted on"
        await loops.stop_all()
    asyncio.run(scenario())


@pytest.mark.parametrize("delay", [3600.0, float("inf")])
def test_a_wait_ends_when_woken(delay):
    async def scenario():
        wake = asyncio.Event()
        waiting = asyncio.create_task(wait_woken(wake, delay))
        wake.set()
        await asyncio.wait_for(waiting, 2.0)
    asyncio.run(scenario())


def test_a_wait_ends_unwoken_after_its_delay():
    asyncio.run(asyncio.wait_for(wait_woken(asyncio.Event(), 0.01), 2.0))


def test_a_pass_that_asks_for_another_at_once_gets_it_in_its_slot_before_queued_jobs():
    """A job's first pass makes the Service, the next its workers: that one must not queue behind the fleet."""
    async def scenario():
        order, gate = [], asyncio.Event()

        async def reconcile(loop):
            order.append(loop.key)
            if loop.key == "first" and order.count("first") == 1:
                await gate.wait()
                return 0.0  # made the Service: the workers next, at once
            return 60.0

        loops = JobLoops(reconcile, LOG, concurrency=1)
        loops.ensure("first")
        await until(lambda: order == ["first"])
        for key in ("b", "c"):
            loops.ensure(key)  # queued for the one slot
        gate.set()
        await until(lambda: len(order) == 4)
        assert order == ["first", "first", "b", "c"]
        await loops.stop_all()
    asyncio.run(scenario())


def test_a_job_that_always_asks_at_once_frees_its_slot_after_its_follow_ups():
    async def scenario():
        order = []

        async def reconcile(loop):
            order.append(loop.key)
            return 0.0 if loop.key == "spin" else 60.0

        loops = JobLoops(reconcile, LOG, concurrency=1)
        loops.ensure("spin")
        loops.ensure("other")
        await until(lambda: "other" in order)
        assert order.index("other") == FOLLOW_UPS + 1
        await loops.stop_all()
    asyncio.run(scenario())
