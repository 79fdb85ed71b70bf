"""Shorter rendezvous polls for torchrun's agent.

torch's c10d rendezvous learns of changes only by polling its store: an agent waiting for a round sleeps 1 s
between reads, and an agent that is training reads whether a node waits at most once a second (a 1 s cache).
In a scale-up measured on the local cluster those waits were 1.4 s of the 3.6 s between the new agent's
arrival and the group's first step: the survivors noticed the waiting node 0.3 s late, and each agent saw the
round reset and complete up to a second after it happened.

Polling faster changes how often an agent reads, nothing of what it writes: every change still goes through
the store's compare-and-set, fenced by the state read, as before. The cost is reads on the job's own store,
so the interval grows with the job: POLL_FLOOR for small jobs, torch's 1 s from 100 nodes up.
`ELASTICJOB_RDZV_POLL_SECONDS` sets it (1 gives torch's behaviour back).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from elasticjob_warm import compat

POLL_ENV = "ELASTICJOB_RDZV_POLL_SECONDS"
TORCH_POLL = 1.0
POLL_FLOOR = 0.1
# A training agent reads once per poll, so a job's agents read its store at most this often a second (unless
# the floor allows more: 30 reads a second for 3 nodes), as torch's own 1 s polls do at 100 nodes.
READS_PER_SECOND = 100


def poll_seconds(max_nodes: int, environ: Mapping[str, str] = os.environ) -> float:
    if value := environ.get(POLL_ENV):
        return bounded_seconds(POLL_ENV, value, 60)
    return min(TORCH_POLL, max(POLL_FLOOR, max_nodes / READS_PER_SECOND))


def bounded_seconds(name: str, value: str, most: float) -> float:
    """A setting's seconds, more than 0 and at most `most`; else a ValueError that names the setting."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0
    if not 0 < seconds <= most:
        raise ValueError(f"{name}={value!r}: expected seconds, more than 0 and at most {most:g}")
    return seconds


def quicken(poll: float) -> Callable[[], None] | None:
    """Makes the agents' rendezvous poll every `poll` seconds; returns how to undo it, or None when this torch's
    rendezvous is not the one this was written against (it is then left as it is)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    rdzv: Any = dynamic_rendezvous  # its private _delay is patched below
    if compat.polling_problem(rdzv) is not None:
        return None
    holder = rdzv._BackendRendezvousStateHolder
    torch_delay, torch_init = rdzv._delay, holder.__init__

    def delay(seconds: float | tuple[float, float]) -> None:  # torch passes it by name
        # The op executor's poll is the only caller that asks for exactly TORCH_POLL.
        torch_delay(poll if seconds == TORCH_POLL else seconds)

    def init(self: Any, backend: Any, settings: Any, cache_duration: float = TORCH_POLL) -> None:
        torch_init(self, backend, settings, min(cache_duration, poll))

    rdzv._delay, holder.__init__ = delay, init

    def undo() -> None:
        rdzv._delay, holder.__init__ = torch_delay, torch_init
    return undo


def apply(nnodes: str) -> None:
    """For the agent, given torchrun's --nnodes (N or MIN:MAX): quicken its polls, and say so (or why not) in
    the pod's log. Raises ValueError for a bad ELASTICJOB_RDZV_POLL_SECONDS."""
    try:
        max_nodes = int(nnodes.rsplit(":", 1)[-1])
    except ValueError:
        return  # torchrun says what is wrong with it
    seconds = poll_seconds(max_nodes)
    if seconds == TORCH_POLL:
        return
    if quicken(seconds) is None:
        print("elasticjob_warm.torchrun: this torch's rendezvous is not the one known; it polls once a second",
              file=sys.stderr, flush=True)
        return
    print(f"elasticjob_warm.torchrun: rendezvous polled every {seconds:g} s (torch's default: 1 s)",
          file=sys.stderr, flush=True)
