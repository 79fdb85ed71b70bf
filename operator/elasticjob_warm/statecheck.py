"""The agent reads the rendezvous state without running what the store holds.

torch's agents keep the whole rendezvous in one key of the job's store, `torch.rendezvous.<run_id>`, as
base64(pickle(state)), and read it back with `pickle.loads` (dynamic_rendezvous: _BackendRendezvousStateHolder.sync).
Anyone who reaches the store's port could write a pickle there that every agent would run. Here the name `pickle`
that torch's module sees is pickle itself but for `loads`, which is elasticjob_store.state.decode_as with torch's
own classes (the store builds stand-ins of them): the opcodes walked without running them, five globals allowed,
every field checked; the same decoder the store uses. The kit copies both packages into one lib/, so it is always
at hand where the kit starts the agent.

A state the decoder refuses is logged once and read as nothing new: the agent keeps the state it last read (an
empty one before its first read) under the refused bytes' token, so that its next write (a heartbeat, a join,
the close at its end) replaces them through torch's own compare-and-set. A write that found refused bytes where
the agent's last read was is retried at once on their token, so torch's state machine goes on from its own view.
This is what it sees when another node's write raced its own; no round is lost.
"""

from __future__ import annotations

import base64
import hashlib
import pickle
import sys
import threading
from typing import Any

_current = threading.local()  # the holder whose sync() is running on this thread
_REFUSED = "_elasticjob_refused"  # on the holder: a digest of the bytes it last refused, logged once


class _Pickle:
    """The `pickle` torch's dynamic_rendezvous module sees: the real one, but for loads."""

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)

    @staticmethod
    def loads(data: bytes) -> Any:
        return _decode(data)


def _decode(data: bytes) -> Any:
    from elasticjob_store import state

    holder = getattr(_current, "holder", None)
    try:
        # The decoder takes the store's bytes, base64 and all.
        decoded = state.decode_as(base64.b64encode(data), state.torch_kinds())
        if decoded is None:
            raise state.StateError("the backend's no-state marker where a state was written")
    except state.StateError as error:
        if holder is None:  # not a sync() of ours: torch raises its RendezvousStateError for a PickleError
            raise pickle.UnpicklingError(f"refused: {error}") from None
        _refused(holder, data, error)
        _current.refused = True
        return holder._state
    if holder is not None:
        holder.__dict__.pop(_REFUSED, None)
    return decoded


def _refused(holder: Any, data: bytes, error: Exception) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if holder.__dict__.get(_REFUSED) == digest:
        return
    holder.__dict__[_REFUSED] = digest
    key = getattr(getattr(holder, "_backend", None), "_key", None) or "the rendezvous state key"
    reason = str(error)[:120]  # the decoder's words, never the bytes; repr keeps it on one line
    print(f"elasticjob_warm.torchrun: refused what the store holds under {key} ({reason!r}): this agent keeps "
          f"the state it last read, and its next write replaces it", file=sys.stderr, flush=True)


# What torch's sync() names when it is the one this was written against: it reads the state with pickle.loads into
# _state, and writes when _dirty (mark_dirty sets it).
SYNC_NAMES = ("pickle", "loads", "_state", "_dirty")


def problem(rdzv: Any) -> str | None:
    """Why torch's dynamic_rendezvous module is not the one this was written against; None when it is."""
    if getattr(rdzv, "pickle", None) is not pickle:
        return "dynamic_rendezvous does not read the state with the pickle module"
    holder = getattr(rdzv, "_BackendRendezvousStateHolder", None)
    names = getattr(getattr(getattr(holder, "sync", None), "__code__", None), "co_names", ())
    if not set(SYNC_NAMES) <= set(names) or not callable(getattr(holder, "mark_dirty", None)):
        return "the rendezvous state holder's sync() is not the one known"
    return None


def apply() -> str | None:
    """Makes this process's rendezvous read its state through the decoder; returns why not (nothing patched)."""
    try:
        from elasticjob_store import state  # noqa: F401 - the decoder must be there before torch relies on it
    except ImportError as error:
        return f"elasticjob_store is not importable beside elasticjob_warm ({error})"
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    rdzv: Any = dynamic_rendezvous  # its private holder is patched below
    if getattr(getattr(getattr(rdzv, "_BackendRendezvousStateHolder", None), "sync", None), "_elasticjob_state", 0):
        return None  # applied already
    why = problem(rdzv)
    if why is not None:
        return why
    holder = rdzv._BackendRendezvousStateHolder
    torch_sync = holder.sync

    def sync(self: Any) -> bool | None:
        _current.holder, _current.refused = self, False
        try:
            has_set = torch_sync(self)
            if has_set is False and _current.refused:
                # Our write found refused bytes where our last read was: write again, on their token.
                _current.refused = False
                self.mark_dirty()
                has_set = torch_sync(self)
            return has_set  # type: ignore[no-any-return]
        finally:
            _current.holder = None

    sync._elasticjob_state = True  # type: ignore[attr-defined]
    rdzv.pickle = _Pickle()
    holder.sync = sync
    return None
