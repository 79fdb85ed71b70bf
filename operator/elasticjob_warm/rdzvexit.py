"""The agent's exit when its rendezvous, not its training, ends it.

torch's agent leaves with a traceback and exit code 1 when its rendezvous fails it: the round it joins is closed
(RendezvousClosedError), the state cannot be read (RendezvousStateError; the decoder's UnpicklingError where torch
reads the state outside its holder's sync, statecheck.py), its store stays gone past the join timeout
(RendezvousConnectionError, outage.py), or no round forms in time (RendezvousTimeoutError). Each leaves torch's
agent.run, its rendezvous handler's shutdown and torchrun's @record as it is, and the process's exit code was 1:
the operator took it for a failed training and charged it. Anyone who reaches the store's port can bring these
about: a valid state with closed=True and one node in its wait list makes every running agent stop its workers for
the next round (a membership change) and meet the closed one.

Here, when no worker of this agent failed on the way to the error (it joined at its start or after a membership
change, or its check for waiting nodes raised while its workers trained), the agent writes one line naming the
error's type (never its text: torch's messages may carry what the store holds) and exits RENDEZVOUS_EXIT; the
operator books the pod RendezvousFailed, not charged, no node avoided (elasticjob/observe.py,
planner/failures.py). A restart after a worker failed (torch set the group FAILED or UNHEALTHY before it) that
meets such an error keeps torchrun's exit: the training failed first, and that is charged as before.

A job that succeeded closes its rendezvous too (each agent's shutdown does as it leaves 0), and an agent still
joining then meets the closed round. It exits RENDEZVOUS_EXIT now instead of 1, and the operator books it as it
did: a pod failed once a worker exited 0 is not charged ("training had already finished"), a rule that comes
before the exit code's. A node torch put in its redundancy list leaves as torchrun does: its
RendezvousGracefulExitError is no error here.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

# The operator reads it with the line below (elasticjob/observe.py RENDEZVOUS_EXIT; a unit test keeps them equal).
RENDEZVOUS_EXIT = 87
LINE = "elasticjob_warm.torchrun: the rendezvous ended this agent: "


class _Seen:
    """Whether the agent's latest restart followed a failure of its workers; None: not known (not patched)."""

    worker_failed: bool | None = None


SEEN = _Seen()


def is_rendezvous_error(error: BaseException) -> bool:
    """An error of the rendezvous that ends torch's agent: torch's own (but its graceful exit), or the decoder's
    refusal raised where torch reads the state outside its holder's sync."""
    from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousGracefulExitError

    if isinstance(error, RendezvousGracefulExitError):
        return False
    return isinstance(error, (RendezvousError, pickle.UnpicklingError))


def exit_code(error: BaseException, worker_failed: bool | None = None) -> int | None:
    """RENDEZVOUS_EXIT for a rendezvous error that no worker failure led to; None: torchrun's own exit (the error
    is raised on). `worker_failed`: SEEN's unless given; not known counts as failed."""
    failed = SEEN.worker_failed if worker_failed is None else worker_failed
    if failed is not False or not is_rendezvous_error(error):
        return None
    return RENDEZVOUS_EXIT


def leave(error: BaseException) -> int:
    """The line, then the code to exit with."""
    print(f"{LINE}{type(error).__name__}", file=sys.stderr, flush=True)
    return RENDEZVOUS_EXIT


def apply() -> bool:
    """Notes, at each restart of the workers, whether a failure of theirs led to it. False (nothing patched, and
    every rendezvous error leaves as in torchrun) when this torch's agent lacks the names."""
    from torch.distributed.elastic.agent.server import api

    agent: Any = getattr(api, "SimpleElasticAgent", None)
    states: Any = getattr(api, "WorkerState", None)
    torch_restart = getattr(agent, "_restart_workers", None)
    if torch_restart is None or not all(hasattr(states, name) for name in ("FAILED", "UNHEALTHY")):
        return False
    if getattr(torch_restart, "_elasticjob_rdzvexit", False):
        return True
    failed = (states.FAILED, states.UNHEALTHY)

    def _restart_workers(self: Any, worker_group: Any) -> Any:
        # torch's monitor loop sets the group's state to what it saw, then restarts: FAILED or UNHEALTHY after a
        # worker failure, HEALTHY for a membership change (nodes waiting).
        SEEN.worker_failed = getattr(worker_group, "state", None) in failed
        restarted = torch_restart(self, worker_group)
        SEEN.worker_failed = False  # its workers run again: what ends the agent later is not that failure's doing
        return restarted

    _restart_workers._elasticjob_rdzvexit = True  # type: ignore[attr-defined]
    agent._restart_workers = _restart_workers
    if SEEN.worker_failed is None:
        SEEN.worker_failed = False
    return True
