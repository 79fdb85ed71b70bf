"""What a stranger writes into a job's rendezvous store, each write on a connection of its own: torch's state
closed with one waiter (the write that failed a job run through the kit), a forged planned stop, a stop count
jumped past the operator's next stop, a pickle that expands through memo references into 10**30 leaves, and
JSON nested too deep to parse. Run in a pod (`python -c "$(cat intruder.py)" HOST PORT RUN_ID`) by
test_store_intruders.py, and here against a loopback store by tests/unit/test_intruder.py.

Prints one JSON line: each write's name -> "written", or "refused: <error type>" (the connection was closed or
never opened). Needs torch (the worker image has it).
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

SECONDS = 3.0  # each connection's timeout: a gate holds an unknown peer for longer than that, then closes it


def closed_state() -> bytes:
    """torch's own rendezvous state, closed, with one waiter, as the c10d backend stores it (base64 pickle)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    state.round, state.complete, state.closed = 1, True, True
    state.wait_list = {_NodeDesc("10.0.0.99", 1, 0)}
    return base64.b64encode(pickle.dumps(state))


def memo_bomb(levels: int = 30, fan_out: int = 10) -> bytes:
    """A few hundred bytes: each level is a list of `fan_out` references to the level below."""
    value: list[Any] = []
    for _ in range(levels):
        value = [value] * fan_out
    return base64.b64encode(pickle.dumps(value))


def writes(run_id: str) -> dict[str, Callable[[Any], Any]]:
    state_key = f"torch.rendezvous.{run_id}"
    stop = json.dumps({"v": 1, "id": "1.000", "step": 0, "at": 0}).encode()
    return {
        "closed state": lambda store: store.set(state_key, closed_state()),
        "forged stop": lambda store: (store.set("elasticjob.stop.1", stop), store.add("elasticjob.stops", 1)),
        "stop count jumped": lambda store: store.add("elasticjob.stops", 1000),
        "decoder bomb": lambda store: store.set(state_key, memo_bomb()),
        "deep json stop": lambda store: store.set("elasticjob.stop.2", b"[" * 100_000),
    }


def attempt(host: str, port: int, write: Callable[[Any], Any]) -> str:
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=SECONDS))
        write(store)
        store.add("elasticjob.intruder-check", 0)  # a reply: a set is sent without one, so it proves nothing
    except Exception as err:  # noqa: BLE001 - torch's DistNetworkError, RuntimeError, TimeoutError...
        return f"refused: {type(err).__name__}"
    return "written"


def main(argv: list[str]) -> None:
    """Every write at once, each on its own connection: a refused one costs its client's timeout."""
    from concurrent.futures import ThreadPoolExecutor

    host, port, run_id = argv[0], int(argv[1]), argv[2]
    todo = writes(run_id)
    with ThreadPoolExecutor(len(todo)) as pool:
        results = dict(zip(todo, pool.map(lambda write: attempt(host, port, write), todo.values())))
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
