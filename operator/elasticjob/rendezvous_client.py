"""Talks to each job's store (elasticjob_store) over its authenticated control endpoint.

Everything read from the network is validated before use (store_reply.py parses the state it reports; a control
reply is checked by elasticjob_store.protocol): a reply is the tenant's word, sizes are capped, and unreadable
means "unknown": the caller keeps what it knew.

Tokens are HMAC(operator key, job uid): the operator never stores them; the store pod is given only the
token's SHA-256 in its spec (builders.token_digest), so nothing in the API reveals a token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp

from elasticjob import backoff
from elasticjob.observe import StoreView
from elasticjob.store_reply import MAX_NODES, MAX_REPLY_BYTES, parse_state, store_text
from elasticjob_store import protocol

TIMEOUT_SECONDS = 2.0
MIN_KEY_BYTES = 32
# A long-poll is held this long by the store when nothing changes (its MAX_WAIT is 60, in every version); the
# operator gives up a little later. Any change is answered at once, so this is the cost of an idle job: one answer
# per job per 55 s, 180 a second at 10,000 jobs.
LONG_POLL_SECONDS = 55.0
# At most one answer per this long per job, on average: a store that changes its answer all the time (its version,
# its epoch) wakes the job's loop no more often than this. ANSWER_BURST answers may come at once first: a
# recovery is a few changes in a row (the training stalls, an agent misses a heartbeat, the survivors wait in a
# round), and one answer a second made each of them wait up to a second for the one before (a partition was
# noticed 2 s after it, its round re-formed 2 s later).
MIN_ANSWER_INTERVAL = 1.0
ANSWER_BURST = 4


def derive_token(key: bytes, job_uid: str) -> str:
    return hmac.new(key, job_uid.encode(), hashlib.sha256).hexdigest()


def check_key(key: bytes) -> bytes:
    """The operator's rendezvous key, refused when shorter than MIN_KEY_BYTES: every job's token is derived from
    it, and a short key can be guessed offline from one token seen (a store pod's digest is in its spec)."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the rendezvous key is {len(key)} bytes; at least {MIN_KEY_BYTES} are needed (the chart "
                         f"makes 48 random characters; e.g. `head -c 48 /dev/urandom | base64`)")
    return key


class StoreClient:
    """One HTTP session for every store the operator talks to."""

    def __init__(self, key: bytes):
        self._key = check_key(key)
        self._session: aiohttp.ClientSession | None = None

    def token(self, job_uid: str) -> str:
        return derive_token(self._key, job_uid)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No connection limit: a fleet holds one long-poll open per running job.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS),
                                                  connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def state(self, host: str, port: int, job_uid: str, *, after: int = -1, epoch: str = "",
                    wait: float = 0.0, max_nodes: int = MAX_NODES) -> StoreView | None:
        """The store's state; with `wait`, once it changed since (`epoch`, `after`), or after `wait` seconds."""
        path = protocol.StateQuery(after, epoch, wait).path()
        raw = await self._request("GET", host, port, path, job_uid, timeout=wait + TIMEOUT_SECONDS + 3)
        return parse_state(raw, max_nodes=max_nodes) if raw is not None else None

    async def act(self, host: str, port: int, job_uid: str, request: protocol.Request
                  ) -> protocol.ActionReply | protocol.ErrorReply:
        """POST one control request; the store's reply as its type, or an ErrorReply when there was none. The
        texts in it are the tenant's words, tamed (the caller logs them)."""
        raw = await self._request("POST", host, port, protocol.path(request), job_uid, request.to_wire())
        if raw is None:
            return protocol.ErrorReply("no answer from the store")
        try:
            reply = request.reply(json.loads(raw) if len(raw) <= MAX_REPLY_BYTES else None)
        except ValueError as err:  # not JSON, or protocol.Invalid
            return protocol.ErrorReply(f"the store's answer was not a {request.KIND} reply: {store_text(str(err))}")
        refused = store_text(reply.refused) if reply.refused is not None else None
        return replace(reply, reason=store_text(reply.reason), refused=refused)

    async def _request(self, method: str, host: str, port: int, path: str, job_uid: str,
                       body: dict[str, Any] | None = None, timeout: float = TIMEOUT_SECONDS) -> bytes | None:
        headers = {"Authorization": f"Bearer {self.token(job_uid)}"}
        try:
            async with self._client().request(method, f"http://{host}:{port}{path}", json=body, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                raw = await response.content.read(MAX_REPLY_BYTES + 1)
                return raw if response.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class Pace:
    """A token bucket: `burst` turns at once, then one per `interval`. Pacing, not synchronisation: however fast
    a store answers, its job's loop wakes no more often than this. Slots and two floats: a limiter library's
    object (aiolimiter's) is 0.5 KB, 5 MB at 10,000 jobs, against the operator's 600 MiB target."""

    __slots__ = ("burst", "interval", "tokens", "filled_at")

    def __init__(self, burst: int, interval: float) -> None:
        self.burst, self.interval = float(burst), interval
        self.tokens, self.filled_at = self.burst, asyncio.get_running_loop().time()

    async def turn(self) -> None:
        now = asyncio.get_running_loop().time()
        self.tokens = min(self.burst, self.tokens + (now - self.filled_at) / self.interval)
        self.filled_at = now
        if self.tokens < 1:
            await asyncio.sleep((1 - self.tokens) * self.interval)
            self.tokens, self.filled_at = 1.0, asyncio.get_running_loop().time()
        self.tokens -= 1


async def watch(client: StoreClient, host: str, port: int, job_uid: str,
                on_view: Callable[[StoreView], None], max_nodes: int = MAX_NODES,
                interval: float = MIN_ANSWER_INTERVAL, burst: int = ANSWER_BURST) -> None:
    """Long-polls one store for ever, handing over each view that differs from the last: `burst` at once, then
    one per `interval` on average; an unreachable (or refused) store is asked again with backoff. Cancel the task
    to stop."""
    last: StoreView | None = None
    failures = 0
    pace = Pace(burst, interval)
    while True:
        await pace.turn()
        view = await client.state(host, port, job_uid, after=last.version if last else -1,
                                  epoch=last.epoch if last else "", wait=LONG_POLL_SECONDS if last else 0.0,
                                  max_nodes=max_nodes)
        if view is None:
            await asyncio.sleep(backoff.step(backoff.STORE_POLL, failures))
            failures += 1
            continue
        failures = 0
        if last is None or (view.epoch, view.version) != (last.epoch, last.version):
            on_view(view)
        last = view
