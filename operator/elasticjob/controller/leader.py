"""Leader election of the operator's replicas on a Lease: the I/O around lease.py's decisions.

Why not the official client's `kubernetes.leaderelection` (in kubernetes 37): it runs blocking loops in threads
(`time.sleep`) that cannot be cancelled, so SIGTERM cannot stop it, and it never releases the Lease, so a
rolling upgrade would wait out the whole lease before the next replica acts; once it has lost the lease its
`run()` returns for good; it talks through the process-wide default client, not ours; and it logs at info on
every retry. The loop here is about 100 lines of asyncio around the pure rules (lease.py, client-go's), with a
clock a test can pass in.

Its requests go through their own Kube with one thread of its own: a renewal must never wait in the queue of a
busy fleet's reconciles (the shared pool), and each carries a timeout within the renew deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from elasticjob import k8s, lease
from elasticjob.lease import Seen, Timing, Verdict, Where

DEFAULT_TIMING = Timing()


def utc_now() -> datetime:
    return datetime.now(UTC)


class Elector:
    def __init__(self, kube: k8s.Kube, where: Where, logger: logging.Logger, timing: Timing = DEFAULT_TIMING,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = utc_now):
        self.kube, self.where, self.log, self.timing = kube, where, logger, timing
        self.clock, self.wall = clock, wall
        self.seen: Seen | None = None
        self.renewed_at: float | None = None  # when the last successful write of ours was sent
        self.leading = False
        self.other = ""  # the holder last seen when it was not us

    async def run(self, started: Callable[[], None], lost: Callable[[], None]) -> None:
        """Wait to be leader, call `started`, renew; return after calling `lost` once a renewal cannot be had."""
        self.log.info(f"leader election: candidate {self.where.identity} for Lease "
                      f"{self.where.namespace}/{self.where.name}; not reconciling until elected")
        logged = None
        while (outcome := await self.attempt()) is not Verdict.RENEW:
            if outcome is Verdict.WAIT and self.other != logged:
                self.log.info(f"leader election: the Lease is held by {self.other}; this replica waits, not "
                              f"reconciling")
                logged = self.other
            await asyncio.sleep(self.timing.retry_every)
        self.leading = True
        self.log.info(f"leader election: {self.where.identity} is the leader; reconciling")
        started()
        await self._renew_until_lost()
        self.leading = False
        lost()

    async def _renew_until_lost(self) -> None:
        while True:
            await asyncio.sleep(self.timing.renew_every)
            while True:
                outcome = await self.attempt()
                if outcome is Verdict.RENEW:
                    break
                if outcome is Verdict.WAIT:  # another holds it: we were taken for dead
                    self.log.error(f"leader election: lost the Lease: it is now held by {self.other}")
                    return
                assert self.renewed_at is not None
                if not lease.still_leading(self.renewed_at, self.clock(), self.timing):
                    self.log.error(f"leader election: lost the Lease: no renewal for {self.timing.renew_deadline:g} s")
                    return
                await asyncio.sleep(self.timing.retry_every)

    async def attempt(self) -> Verdict | None:
        """One read and, unless another holds it, one write. RENEW: we hold the Lease now; WAIT: another does;
        None: the API server failed or another candidate won the write race (409)."""
        sent = self.clock()
        try:
            current = await self.kube.get_lease(self.where.namespace, self.where.name, self._request_timeout())
            verdict, self.seen = lease.decide(current, self.where.identity, self.seen, self.clock(), self.timing)
            if verdict is Verdict.WAIT:
                self.other = lease.holder(current)
                return Verdict.WAIT
            body = lease.claim(current, verdict, self.where, self.wall(), self.timing)
            if verdict is Verdict.CREATE:
                await self.kube.create_lease(body, self._request_timeout())
            else:
                await self.kube.replace_lease(body, self._request_timeout())
        except k8s.Conflict:
            return None
        except k8s.KubeError as exc:
            self.log.warning(f"leader election: Lease {self.where.namespace}/{self.where.name}: {exc}")
            return None
        if verdict is Verdict.TAKE:
            self.log.info(f"leader election: took the Lease from {lease.holder(current) or 'nobody (released)'}")
        self.renewed_at = sent
        return Verdict.RENEW

    def _request_timeout(self) -> float:
        """A request never outlasts the time the leader has left, nor hangs a candidate's loop."""
        if self.leading and self.renewed_at is not None:
            left = self.timing.renew_deadline - (self.clock() - self.renewed_at)
            return max(0.5, min(left, self.timing.renew_deadline / 2))
        return self.timing.renew_deadline / 2

    async def release(self) -> None:
        """Give the Lease up (clean shutdown): the next replica takes it at its next read, not after the lease
        runs out. Only when it is still ours, and only the version read (a 409 means someone else moved it)."""
        if not self.leading:
            return
        self.leading = False
        try:
            current = await self.kube.get_lease(self.where.namespace, self.where.name, self.timing.retry_every)
            body = lease.released(current, self.where.identity, self.wall())
            if body is not None:
                await self.kube.replace_lease(body, self.timing.retry_every)
                self.log.info(f"leader election: released Lease {self.where.namespace}/{self.where.name}")
        except k8s.KubeError as exc:
            self.log.warning(f"leader election: could not release the Lease (the next leader waits for it to "
                             f"run out): {exc}")
