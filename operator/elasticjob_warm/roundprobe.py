"""The link probe at each round: with ELASTICJOB_LINK_PROBE=1 (the operator sets it from spec.nodeCheck.linkProbe)
the agent runs linkprobe.run() right after its rendezvous completes and before it starts its workers, on the
round's own store, with the round's other agents. Rounds of fewer than MIN_AGENTS skip it: a pair's one slow link
cannot say which end is slow.

The probe is bounded (ELASTICJOB_LINK_PROBE_SECONDS) and never raises: a failed probe leaves one line and the
workers start as they would have. torch's agent is patched at one method, SimpleElasticAgent._rendezvous; a torch
whose agent has no such method runs without the probe (apply() says so).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from elasticjob_store.links import MIN_AGENTS
from elasticjob_warm import linkprobe

PROBE_ENV = "ELASTICJOB_LINK_PROBE"


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for the probe; ValueError for a value that is neither 1 nor 0."""
    asked = environ.get(PROBE_ENV) or "0"
    if asked not in ("0", "1"):
        raise ValueError(f"{PROBE_ENV}={asked!r}: expected 1 (probe the round's links) or 0")
    return asked == "1"


def apply(environ: Mapping[str, str] | None = None) -> bool:
    """Patches the agent to probe after each rendezvous where the environment asks; False where it asks and the
    agent is not the one known (nothing is patched then)."""
    env = dict(os.environ if environ is None else environ)
    if not wanted(env):
        return True
    from torch.distributed.elastic.agent.server import api

    agent: Any = api.SimpleElasticAgent
    original = getattr(agent, "_rendezvous", None)
    if original is None or getattr(original, "elasticjob_probes", False):
        return original is not None

    def _rendezvous(self: Any, worker_group: Any) -> None:
        original(self, worker_group)
        after_round(worker_group, env)

    _rendezvous.elasticjob_probes = True  # type: ignore[attr-defined]
    agent._rendezvous = _rendezvous
    return True


def after_round(worker_group: Any, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The probe among the round's agents, on the round's store; None where the round is too small."""
    world = getattr(worker_group, "group_world_size", None)
    rank = getattr(worker_group, "group_rank", None)
    store = getattr(worker_group, "store", None)
    if store is None or not isinstance(world, int) or not isinstance(rank, int) or world < MIN_AGENTS:
        return None
    return linkprobe.run(store, rank, world, environ)
