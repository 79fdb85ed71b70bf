"""Riding out a lost rendezvous store: the agent keeps its workers training while the job's store is gone, and
when a store answers again at the same address, restarts them in place through a new round there.

torch's agent exits as soon as its store stops answering (its check for waiting nodes raises), which cost every
pod of the job: each was replaced, and started cold. The workers themselves never use the rendezvous store
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: their own store lives with rank 0's agent), so they can train on.

The store comes back empty (it keeps its state in memory), at the same Service address. A TCPStore client never
reconnects (measured: "Broken pipe" for ever after the server restarted), so the agent's check connects a new one
and hands a new backend on it (torch's own class, whose constructor seeds the state key) to the rendezvous
handler. The first agent back writes the round it runs there and the others find it, so the workers train on
(resume.py). Where that round cannot be resumed, the check reports a waiting node, which is what makes torch's
agent stop its workers and join the next round: the same path as a scale-up, and no restart is spent.

An agent that loses its store while it joins a round (after a failure, a scale change, or at its start) has
stopped its workers already: it waits for the store the same way and joins a round there.

Why this makes no second world: an agent stops its old workers before it joins the new store's round, and the
old world steps only while all its ranks run, so no step of the old world follows the first of the new one
among agents that joined it. A node that joins the new store alone forms a round only after torch's last call
(2 s by the operator's default); the survivors find the store within their next check (0.1 s polls), join its
round and restart it. Past torch's join timeout without a store the agent exits as torch's does.

Touches private names: the handler's `_store` and `_state_holder._backend` (and the backend's `_store`, to check
that they are one TCPStore) and `_settings.timeout.join`, checked where used: a torch without the first keeps
torch's behaviour (the agent exits, its pod is replaced), one without the last waits for the read timeout.
"""

from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta
from typing import Any

from elasticjob_warm import resume

# How long a connect to a store that is still gone may hold up the agent's monitoring loop.
CONNECT_SECONDS = 1.0
# Between connects while the agent waits in a rendezvous for its store to come back.
RETRY_SECONDS = 0.2


def log(message: str) -> None:
    print(f"elasticjob_warm.torchrun: {message}", file=sys.stderr, flush=True)


class Outage:
    """One agent's view of its store: since when it is gone."""

    def __init__(self) -> None:
        self.since: float | None = None

    def lost(self, handler: Any, error: BaseException, running: bool = True) -> int:
        """Called with the error the check raised: 0 (nobody waits) while the store is gone; once a new one
        answers, the nodes waiting in the round resumed there (resume.py; `running`: the agent's workers run), or
        1 where none was (torch's agent then restarts the workers through a new round); re-raises past the store's
        read timeout, or when this torch's handler is not the known one."""
        old = _stores(handler)
        if old is None:
            raise error
        timeout = old.timeout.total_seconds() if isinstance(old.timeout, timedelta) else 60.0
        patience = _patience(handler, timeout)
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log(f"the rendezvous store at {old.host}:{old.port} stopped answering ({error}); the workers train "
                f"on, and rejoin when it is back (for up to {patience:g} s)")
        if now - self.since > patience:
            log(f"no rendezvous store for {patience:g} s: leaving, as torchrun does")
            raise error
        fresh = _connect(old.host, old.port, timeout)
        if fresh is None:
            return 0
        # A new backend on it, as torch makes one: its constructor seeds the state key that reads wait on.
        backend = handler._state_holder._backend
        handler._state_holder._backend = type(backend)(fresh, handler.get_run_id())
        handler._store = fresh
        gone = time.monotonic() - self.since
        try:
            waiting = resume.resume(handler, gone) if running else None
        except Exception as again:  # noqa: BLE001 - gone again before the round was written: the next check tries
            log(f"the rendezvous store that answered is gone again ({again})")
            return 0
        self.since = None
        if waiting is None:
            log(f"a rendezvous store answers again after {gone:.1f} s: restarting the workers through a new round")
            return 1  # a waiting node, as torch's agent understands it: stop the workers, join the new round
        log(f"a rendezvous store answers again after {gone:.1f} s: round {handler._state_holder._state.round} "
            f"resumed on it, the workers train on")
        return waiting


    def wait(self, handler: Any, error: BaseException) -> None:
        """Blocks until a store answers again and is the handler's (for an agent between rounds: its workers
        are stopped, so there is nothing to train on meanwhile); re-raises as lost() does."""
        while not self.lost(handler, error, running=False):
            time.sleep(RETRY_SECONDS)


def _patience(handler: Any, read_timeout: float) -> float:
    """How long the agent waits for a store: torch's join timeout, the time it gives a round to form (no round
    forms without a store). Not the read timeout: a store on a lost node is replaced only once the node's pods
    are evicted, a minute and more after the loss, and an agent that left meanwhile cost its pod and a restart.
    A torch whose handler keeps its settings elsewhere: the read timeout, as before."""
    join = getattr(getattr(getattr(handler, "_settings", None), "timeout", None), "join", None)
    return max(join.total_seconds(), read_timeout) if isinstance(join, timedelta) else read_timeout


def _stores(handler: Any) -> Any:
    """The handler's store when it and its backend's are the one TCPStore this was written against."""
    store = getattr(handler, "_store", None)
    backend = getattr(getattr(handler, "_state_holder", None), "_backend", None)
    if store is None or getattr(backend, "_store", None) is not store:
        return None
    if not all(hasattr(store, name) for name in ("host", "port", "timeout")):
        return None
    return store


def _connect(host: str, port: int, timeout: float) -> Any:
    import torch.distributed as dist

    TCPStore: Any = dist.TCPStore  # type: ignore[attr-defined]  # noqa: N806 - not in torch's stubs

    if not _listening(host, port):
        return None
    try:
        store = TCPStore(host, port, is_master=False, multi_tenant=True,
                         timeout=timedelta(seconds=CONNECT_SECONDS))
    except (RuntimeError, ValueError, TimeoutError):
        return None
    store.set_timeout(timedelta(seconds=timeout))
    return store


def _listening(host: str, port: int) -> bool:
    """Whether something accepts at the store's address. A TCPStore client retries a refused connect with a
    backoff until its timeout, so each try against a store still gone held the agent's check 1.5 s (measured, with
    a 1 s timeout), and it saw the new store up to that late: agents rejoined up to 1.5 s apart, and the first
    formed a round alone before the second made them both restart. A refused connect answers at once."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError:
        return False
    return True


def apply() -> bool:
    """Patches the rendezvous handler's check for waiting nodes; False (nothing patched) when this torch's
    handler lacks it."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    handler: Any = getattr(rdzv, "DynamicRendezvousHandler", None)
    torch_check = getattr(handler, "num_nodes_waiting", None)
    if torch_check is None or getattr(torch_check, "_elasticjob_outage", False):
        return torch_check is not None

    def num_nodes_waiting(self: Any) -> int:
        outage = self.__dict__.setdefault("_elasticjob_outage", Outage())
        try:
            return int(torch_check(self))
        except RendezvousConnectionError as error:
            return int(outage.lost(self, error))

    torch_next = handler.next_rendezvous

    def next_rendezvous(self: Any) -> Any:
        """The store lost while the agent joins a round (its workers already stopped): wait for it, join there."""
        outage = self.__dict__.setdefault("_elasticjob_outage", Outage())
        while True:
            try:
                return torch_next(self)
            except RendezvousConnectionError as error:
                outage.wait(self, error)

    if not resume.apply_exit_barrier():
        log("this torch's agent is not the one known: its end waits on the store of its last round")
    num_nodes_waiting._elasticjob_outage = True  # type: ignore[attr-defined]
    handler.num_nodes_waiting = num_nodes_waiting
    handler.next_rendezvous = next_rendezvous
    return True
