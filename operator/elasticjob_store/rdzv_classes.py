"""torch's two rendezvous classes, as the store holds them without importing torch (2-6 s on a loaded node).

The agents pickle a `_RendezvousState` whose nodes are `_NodeDesc`s (torch/distributed/elastic/rendezvous/
dynamic_rendezvous.py). The store decodes that pickle into the stand-ins below and, for a nudge, pickles them back
under torch's own names, byte for byte what an agent's `pickle.dumps` writes (compat.py checks it against this
torch at start; tests/unit/test_store_rdzv_classes.py against the torch installed here). The agent's own decoder
(elasticjob_warm.statecheck) asks for torch's classes instead (`torch_kinds`): what it decodes goes back to torch.
Standard library only.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Optional

RDZV_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


@dataclass(eq=True, order=True, frozen=True)
class NodeDesc:
    """torch's _NodeDesc: the same fields, equality, order and hash (a frozen dataclass's, over the fields)."""

    addr: str
    pid: int
    local_id: int

    def __repr__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"


class RendezvousState:
    """torch's _RendezvousState: the same fields, the same empty start."""

    round: int
    complete: bool
    deadline: Optional[datetime]  # noqa: UP045 - the store's modules run on the agents' Python (3.9 included)
    closed: bool
    participants: dict[NodeDesc, int]
    wait_list: set[NodeDesc]
    redundancy_list: set[NodeDesc]
    last_heartbeats: dict[NodeDesc, datetime]

    def __init__(self) -> None:
        self.round = 0
        self.complete = False
        self.deadline = None
        self.closed = False
        self.participants = {}
        self.wait_list = set()
        self.redundancy_list = set()
        self.last_heartbeats = {}


class Kinds(NamedTuple):
    """The classes a decoded state is made of: the stand-ins here (the store), or torch's (an agent)."""

    state: type[Any]
    node: type[Any]


STANDINS = Kinds(RendezvousState, NodeDesc)
TORCH_NAMES = {RendezvousState: "_RendezvousState", NodeDesc: "_NodeDesc"}


def torch_kinds() -> Kinds:
    """torch's own classes; imports torch's rendezvous module (seconds), so only where torch runs already."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    return Kinds(rdzv._RendezvousState, rdzv._NodeDesc)


class _TorchNamesPickler(pickle._Pickler):
    """Python's own pickler (the C one has no save_global to override), but a stand-in class is written as
    torch's class of the same name."""

    def save_global(self, obj: Any, name: Optional[str] = None) -> None:  # noqa: UP045 - as above
        this: Any = self  # save, write and memoize are the pure-Python pickler's, not in its stubs
        torch_name = TORCH_NAMES.get(obj)
        if torch_name is None:
            pickle._Pickler.save_global(this, obj, name)  # type: ignore[attr-defined]
            return
        # What save_global writes for a class of protocol 4 and later, without importing its module to check it.
        this.save(RDZV_MODULE)
        this.save(torch_name)
        this.write(pickle.STACK_GLOBAL)
        this.memoize(obj)


def dumps(state: Any, protocol: int = pickle.DEFAULT_PROTOCOL) -> bytes:
    """pickle.dumps(state) as an agent would write torch's state with the same fields: the stand-in classes
    named as torch's (from protocol 4; earlier ones look the class up by its name)."""
    out = io.BytesIO()
    _TorchNamesPickler(out, protocol).dump(state)
    return out.getvalue()
