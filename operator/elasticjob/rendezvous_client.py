"""Reads what the rendezvous pod serves about torch's rendezvous (round, nodes): HTTP JSON, short timeout.

torchrun restarts its workers in place without the pod noticing; the rendezvous round is where such
restarts (and membership changes) show, so the operator reports it in status.rendezvous.
"""

from __future__ import annotations

import asyncio

import aiohttp

from elasticjob.observe import RendezvousView

TIMEOUT_SECONDS = 1.0


async def fetch(host: str, port: int) -> RendezvousView | None:
    """None when the state cannot be read now (store starting, network policy): status keeps its last value."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as session:
            async with session.get(f"http://{host}:{port}/") as response:
                data = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("round") is None:
        return None
    return RendezvousView(round=int(data["round"]), nodes=int(data.get("nodes") or 0))
