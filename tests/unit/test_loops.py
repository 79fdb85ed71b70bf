"""Per-job reconcile loops: events coalesce, a failing reconcile does not end the loop, forget stops it."""

from __future__ import annotations

import asyncio
import functools
import logging

import helpers
from elasticjob.controller.loops import JobLoops

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
        loops.observe("k")
        await until(lambda: seen == [1])
        for v in (2, 3, 4):  # three events while the first reconcile runs
            state["v"] = v
            loops.observe("k")
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
        loops.observe("k")
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
        loops.observe("bad")
        loops.observe("good")
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
        loops.observe("k")
        await until(lambda: len(calls) >= 2)  # the requested delay wakes it by itself
        await loops.forget("k")
        stopped_at = len(calls)
        await asyncio.sleep(0.1)
        assert len(calls) == stopped_at and len(loops) == 0 and "k" not in loops
        loops.wake("k")  # waking a forgotten job is harmless
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
            loops.observe(key)
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
        loops.observe("holds the slot")
        await until(lambda: started == ["holds the slot"])
        loops.observe("waits for it")
        await loops.stop_all()
        assert started == ["holds the slot"] and len(loops) == 0
    asyncio.run(scenario())
