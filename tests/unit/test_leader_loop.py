"""The leader election loop (controller/leader.py): replicas against one Lease kept as the API server keeps it
(a resourceVersion per write, 409 on a stale one), on a shortened timing. Against the real API server, with two
operator processes: tests/integration/test_leader_election.py."""

from __future__ import annotations

import asyncio
import copy
import logging
import time

import pytest

from elasticjob import k8s
from elasticjob.controller.leader import Elector
from elasticjob.lease import Timing, Where

# A tenth of the operator's (10 s lease, 2 s renewals, 1 s reads, 8 s deadline).
FAST = Timing(duration=1.0, renew_every=0.2, retry_every=0.1, renew_deadline=0.8)


class LeaseServer:
    """One Lease as the API server stores it: create once, replace only at the current resourceVersion."""

    def __init__(self) -> None:
        self.body: dict | None = None
        self.version = 0
        self.writes: list[str] = []  # the holder of each accepted write
        self.down = False  # every request fails as with no API server

    def _check(self) -> None:
        if self.down:
            raise k8s.Unavailable(0, "Unavailable", "no answer")

    async def get_lease(self, namespace, name, timeout):
        self._check()
        return copy.deepcopy(self.body)

    async def create_lease(self, body, timeout):
        self._check()
        if self.body is not None:
            raise k8s.Conflict(409, "AlreadyExists", "exists")
        return self._store(body)

    async def replace_lease(self, body, timeout):
        self._check()
        if self.body is None or body["metadata"].get("resourceVersion") != self.body["metadata"]["resourceVersion"]:
            raise k8s.Conflict(409, "Conflict", "the object has been modified")
        return self._store(body)

    def _store(self, body):
        self.version += 1
        self.body = copy.deepcopy(body)
        self.body["metadata"]["resourceVersion"] = str(self.version)
        self.writes.append(self.body["spec"].get("holderIdentity", ""))
        return copy.deepcopy(self.body)

    def close(self) -> None:
        pass


class Replica:
    def __init__(self, server: LeaseServer, name: str):
        self.elector = Elector(server, Where("elasticjob-operator", "ops", name),  # type: ignore[arg-type]
                               logging.getLogger(f"test.{name}"), FAST)
        self.leading_since: float | None = None
        self.lost_at: float | None = None
        self.task: asyncio.Task | None = None

    def start(self) -> Replica:
        self.task = asyncio.create_task(self.elector.run(self._started, self._lost))
        return self

    def _started(self) -> None:
        self.leading_since = time.monotonic()

    def _lost(self) -> None:
        self.lost_at = time.monotonic()

    async def kill(self) -> None:
        """As SIGKILL: no more requests, nothing released."""
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.01)


def leaders(replicas: list[Replica]) -> list[Replica]:
    return [r for r in replicas if r.leading_since is not None and r.lost_at is None]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_exactly_one_of_two_leads_and_the_other_keeps_waiting():
    async def scenario():
        server = LeaseServer()
        replicas = [Replica(server, "a").start(), Replica(server, "b").start()]
        await until(lambda: leaders(replicas), 2, "a leader")
        await asyncio.sleep(FAST.duration * 2)  # two lease durations of renewals: the other must not take over
        assert len(leaders(replicas)) == 1
        assert set(server.writes) == {leaders(replicas)[0].elector.where.identity}
        for replica in replicas:
            await replica.kill()

    run(scenario())


def test_a_killed_leader_is_replaced_after_the_lease_runs_out():
    async def scenario():
        server = LeaseServer()
        first = Replica(server, "a").start()
        await until(lambda: first.leading_since is not None, 2, "a to lead")
        second = Replica(server, "b").start()
        await until(lambda: second.elector.other == "a", 2, "b to see a hold it")
        await first.kill()
        killed = time.monotonic()
        await until(lambda: second.leading_since is not None, FAST.duration * 3, "b to take over")
        waited = second.leading_since - killed
        # Not before the lease ran out since the last renewal it saw, and soon after.
        assert FAST.duration - FAST.renew_every <= waited <= FAST.duration + 2 * FAST.retry_every + 0.2
        assert server.body["spec"]["leaseTransitions"] == 1
        await second.kill()

    run(scenario())


def test_a_released_lease_is_taken_at_the_next_read():
    async def scenario():
        server = LeaseServer()
        first = Replica(server, "a").start()
        await until(lambda: first.leading_since is not None, 2, "a to lead")
        second = Replica(server, "b").start()
        await until(lambda: second.elector.other == "a", 2, "b to see a hold it")
        await first.kill()
        await first.elector.release()
        released = time.monotonic()
        await until(lambda: second.leading_since is not None, FAST.duration, "b to take the released Lease")
        assert second.leading_since - released <= 2 * FAST.retry_every + 0.1
        await second.kill()

    run(scenario())


def test_a_leader_that_cannot_renew_stops_before_anyone_may_take_over():
    async def scenario():
        server = LeaseServer()
        leader = Replica(server, "a").start()
        await until(lambda: leader.leading_since is not None, 2, "a to lead")
        server.down = True
        cut = time.monotonic()
        await until(lambda: leader.lost_at is not None, FAST.duration * 2, "a to give up")
        assert leader.lost_at - cut < FAST.duration, "it acted past the time a candidate may take the Lease"
        await leader.task

    run(scenario())


def test_a_leader_whose_lease_was_taken_stops_at_its_next_renewal():
    async def scenario():
        server = LeaseServer()
        leader = Replica(server, "a").start()
        await until(lambda: leader.leading_since is not None, 2, "a to lead")
        server.body["spec"]["holderIdentity"] = "intruder"
        server.body["metadata"]["resourceVersion"] = "999"
        await until(lambda: leader.lost_at is not None, FAST.renew_every * 3, "a to see it lost")
        assert server.writes[-1] == "a" and server.body["spec"]["holderIdentity"] == "intruder"

    run(scenario())


@pytest.mark.parametrize("holder", ["a", "b"])
def test_release_gives_up_only_our_own_lease(holder):
    async def scenario():
        server = LeaseServer()
        replica = Replica(server, "a").start()
        await until(lambda: replica.leading_since is not None, 2, "a to lead")
        await replica.kill()
        if holder != "a":
            server.body["spec"]["holderIdentity"] = holder
        await replica.elector.release()
        assert server.body["spec"].get("holderIdentity") == (None if holder == "a" else holder)

    run(scenario())
