"""Whether this torch is one the store may nudge: checked once, in a child process started once the store serves
(importing torch takes seconds; the store does not wait for it and never imports torch itself), before any nudge
is accepted (but the first round's hold, control.py): until then GET /v1/state says `checking`.

The nudges (remove, complete, restart) rewrite torch's private, pickled `_RendezvousState` in place. They are
only as safe as the match between what state.py and actions.py assume and what this torch's agents do, so
the store turns them off unless (1) torch's version is in the range `make compat` has run against, and (2)
torch's own rendezvous backend and handler, driven in memory here, agree with our decoder, encoder (the stand-in
classes written under torch's names, byte for byte) and waiter. Off, the store still serves plain c10d (the
agents need nothing else) and says why in GET /v1/state.
"""

from __future__ import annotations

import base64
import ctypes
import importlib.metadata
import json
import os
import pickle
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from elasticjob_store.protocol_state import TorchWire
from elasticjob_store.rdzv_classes import STANDINS, Kinds, torch_kinds

# The torch minors the nudges were run against (`make compat`; docs/behaviour.md, "Torch versions"). Inclusive.
SUPPORTED = ((2, 6), (2, 13))
RANGE_TEXT = f"{SUPPORTED[0][0]}.{SUPPORTED[0][1]} to {SUPPORTED[1][0]}.{SUPPORTED[1][1]}"
_PROBE_RUN = "elasticjob-compat-probe"
# What an agent whose warm wrapper fell back to plain torchrun leaves in this store (elasticjob_warm.notice;
# a unit test keeps the two equal): a count of such agent starts and the last reason.
PLAIN_KEY = "elasticjob.warm.plain"
PLAIN_WHY_KEY = "elasticjob.warm.plain.why"
MAX_WHY = 500
# probe() in its child: importing torch on a busy node takes seconds, never minutes.
CHILD_TIMEOUT = 120.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Verdict:
    torch: str  # torch.__version__, or "" when torch could not be imported
    nudges: bool
    why: str  # on: what was checked; off: what failed
    checking: bool = False  # off only until probe() is done

    def report(self) -> TorchWire:
        """The `torch` object of GET /v1/state (control.torch_report adds plain torchrun's count)."""
        return {"version": self.torch, "nudges": self.nudges, "why": self.why, "checking": self.checking,
                "plainTorchrun": None}


def minor(version: str) -> tuple[int, int] | None:
    """(2, 5) for "2.5.1+cu124"; None for what is not a torch release number."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def in_range(version: str) -> bool:
    found = minor(version)
    return found is not None and SUPPORTED[0] <= found <= SUPPORTED[1]


def installed() -> str:
    """torch's version as installed, read without importing torch (milliseconds); "" when it is not found."""
    try:
        return importlib.metadata.version("torch")
    except Exception:  # noqa: BLE001 - not installed, or metadata unreadable: probe() says which
        return ""


def probe_in_child(timeout: float = CHILD_TIMEOUT) -> Verdict:
    """probe() in a child process at the lowest priority: the store's own process never imports torch (its
    import would hold the interpreter's lock for whole seconds while the store serves), and the child's few
    hundred MB of torch are given back when it exits. Never raises."""
    try:
        done = subprocess.run([sys.executable, "-m", "elasticjob_store.compat"], capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Verdict(installed(), False, f"the check of this torch took more than {timeout:.0f} s")
    except OSError as err:
        return Verdict(installed(), False, f"the check of this torch did not start: {err}")
    try:
        found = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
        return Verdict(str(found["version"])[:MAX_WHY], bool(found["nudges"]), str(found["why"])[:MAX_WHY])
    except (ValueError, IndexError, KeyError, TypeError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return Verdict(installed(), False, f"the check of this torch failed: {tail[0][:MAX_WHY]}")


def checking() -> Verdict:
    """The verdict while probe() runs: nudges off until it is done (a few seconds after the store serves)."""
    return Verdict(installed(), False, "checking this torch's rendezvous (nudges are off until it is done)",
                   checking=True)


def probe() -> Verdict:
    """The verdict for the torch this process imports. Never raises: any surprise turns the nudges off."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - the store serves c10d without torch; only the nudges need it
        return Verdict("", False, f"torch does not import: {type(err).__name__}: {err}")
    version = str(getattr(torch, "__version__", ""))
    if not in_range(version):
        return Verdict(version, False, f"torch {version} is outside the range the nudges were tested on "
                                       f"({RANGE_TEXT})")
    try:
        _round_trip()
        _waiter_is_seen()
    except TypeError as err:
        if "offset-naive and offset-aware" not in str(err):
            return Verdict(version, False, f"torch {version}'s rendezvous is not the one known: TypeError: {err}")
        # torch before 2.6 stamps heartbeats and deadlines with naive datetime.utcnow(); the decoder reads the
        # timezone-aware times torch writes since, and mixing the two would break the agents' comparisons.
        return Verdict(version, False, f"torch {version}'s rendezvous keeps naive (timezone-less) times, which "
                                       f"the store does not rewrite")
    except Exception as err:  # noqa: BLE001 - any mismatch with torch's internals
        return Verdict(version, False, f"torch {version}'s rendezvous is not the one known: "
                                       f"{type(err).__name__}: {err}")
    return Verdict(version, True, f"torch {version}: the rendezvous state round-trips and the restart waiter "
                                  f"is seen")


def _sample_state(kinds: Kinds = STANDINS) -> Any:
    now = datetime.now(timezone.utc)
    alive, waiting = kinds.node("10.0.0.1", 7, 0), kinds.node("10.0.0.2", 8, 0)
    state = kinds.state()
    state.round, state.complete, state.deadline = 3, True, now - timedelta(seconds=1)
    state.participants = {alive: 0}
    state.wait_list = {waiting}
    state.last_heartbeats = {alive: now, waiting: now}
    return state


def _backend() -> tuple[Any, Any]:
    import torch.distributed
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    dist: Any = torch.distributed  # HashStore is not in its stubs
    store = dist.HashStore()
    return store, C10dRendezvousBackend(store, _PROBE_RUN)


def _round_trip() -> None:
    """torch's backend writes a state as its agents do; we decode it, encode it back with compare-and-set,
    and torch's backend reads our write as the same state."""
    from elasticjob_store.state import NO_STATE, decode, encode, state_key

    store, backend = _backend()
    key = state_key(_PROBE_RUN)
    empty = store.get(key)
    if empty != NO_STATE:
        raise AssertionError(f"the backend's empty state is {empty!r}, not {NO_STATE!r}")
    sent = _sample_state(torch_kinds())  # as an agent writes it
    backend.set_state(pickle.dumps(sent))
    raw = store.get(key)
    decoded = decode(raw)
    if decoded is None:
        raise AssertionError("the backend wrote no state")
    ours = encode(decoded)
    if store.compare_set(key, raw, ours) != ours:
        raise AssertionError("compare_set did not take our write")
    got, _token = backend.get_state()
    back = pickle.loads(got)
    if vars(back) != vars(sent):
        raise AssertionError("torch's backend read our write as a different state")
    if base64.b64decode(ours) != pickle.dumps(sent):
        raise AssertionError("our encoding differs from the agents'")


def _waiter_is_seen() -> None:
    """The restart nudge works only if torch's handler counts our waiter as a node waiting to join."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from elasticjob_store import actions
    from elasticjob_store.state import encode, state_key

    store, backend = _backend()
    now = datetime.now(timezone.utc)
    state = actions.add_waiter(_sample_state(), 3, now).state
    if state is None:
        raise AssertionError("adding the waiter changed nothing")
    state.wait_list.clear()
    state.wait_list.add(actions.WAITER)
    store.set(state_key(_PROBE_RUN), encode(state))
    handler = DynamicRendezvousHandler.from_backend(_PROBE_RUN, store, backend, 1, 3)
    waiting = handler.num_nodes_waiting()
    if waiting != 1:
        raise AssertionError(f"torch's handler sees {waiting} node(s) waiting with our waiter, not 1")


def _as_child() -> None:
    """Dies with the store, stops on its stop signals (the store blocks them for its sigwait), yields the CPU."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # Linux
    except (OSError, AttributeError):
        pass
    os.nice(19)


if __name__ == "__main__":  # probe_in_child's child: one line of JSON
    _as_child()
    print(json.dumps(probe().report()), flush=True)
