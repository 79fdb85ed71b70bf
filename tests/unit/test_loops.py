"""Per-job reconcile loops: events coalesce, a failing reconcile does not end the loop, forget stops it."""

from __future__ import annotations

import asyncio
import logging

from elasticjob.loops import JobLoops

LOG = logging.getLogger("test")


async def until(predicate, timeout=2.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_events_during_a_reconcile_coalesce_into_one_more_reconcile():
    async def scenario():
        loops, seen, gate = JobLoops(), [], asyncio.Event()

        async def reconcile(body):
            seen.append(body["v"])
            if len(seen) == 1:
                await gate.wait()
            return 60.0

        loops.observe("k", {"v": 1}, reconcile, LOG)
        await until(lambda: seen == [1])
        for v in (2, 3, 4):  # three events while the first reconcile runs
            loops.observe("k", {"v": v}, reconcile, LOG)
        gate.set()
        await until(lambda: len(seen) == 2)
        await asyncio.sleep(0.05)
        assert seen == [1, 4], "one reconcile with the latest body, not one per event"
        await loops.stop_all()
    asyncio.run(scenario())


def test_a_failing_reconcile_is_retried_and_other_jobs_go_on():
    async def scenario():
        loops, calls = JobLoops(), {"bad": 0, "good": 0}

        async def bad(body):
            calls["bad"] += 1
            raise RuntimeError("boom")

        async def good(body):
            calls["good"] += 1
            return 60.0

        loops.observe("bad", {}, bad, LOG)
        loops.observe("good", {}, good, LOG)
        await until(lambda: calls["bad"] == 1 and calls["good"] == 1)
        loops.wake("bad")
        await until(lambda: calls["bad"] == 2)
        await loops.stop_all()
        assert len(loops) == 0
    asyncio.run(scenario())


def test_forget_stops_the_loop():
    async def scenario():
        loops, calls = JobLoops(), []

        async def reconcile(body):
            calls.append(1)
            return 0.01

        loops.observe("k", {}, reconcile, LOG)
        await until(lambda: len(calls) >= 2)  # the requested delay wakes it by itself
        await loops.forget("k")
        stopped_at = len(calls)
        await asyncio.sleep(0.1)
        assert len(calls) == stopped_at and len(loops) == 0
        loops.wake("k")  # waking a forgotten job is harmless
    asyncio.run(scenario())
