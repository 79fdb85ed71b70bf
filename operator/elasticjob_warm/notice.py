"""`python -m elasticjob_warm.notice HOST:PORT WHY`: tell the job's store that this agent runs plain torchrun.

Started detached by torchrun.plain() just before it runs plain torchrun, so that torchrun is not held up: it waits
for the store (the agent's own rendezvous endpoint) as long as torchrun would, then counts this agent under
PLAIN_KEY and leaves the reason under WHY_KEY. The store reports both in GET /v1/state, and the operator puts
them on the job. Plain keys of the store, beside torch's own; nothing of torch's rendezvous is touched.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

PLAIN_KEY = "elasticjob.warm.plain"
WHY_KEY = "elasticjob.warm.plain.why"
MAX_WHY = 500
WAIT_SECONDS = 900


TORCH_PORT = 29400  # torch's own, for an endpoint without one


def endpoint(argv: list[str], environ: dict[str, str]) -> str | None:
    """torchrun's --rdzv-endpoint (either spelling, `=` or not), else PET_RDZV_ENDPOINT; None for --standalone."""
    found = environ.get("PET_RDZV_ENDPOINT")
    for i, arg in enumerate(argv):
        if arg == "--standalone":
            return None
        for name in ("--rdzv-endpoint", "--rdzv_endpoint"):
            if arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
            elif arg == name and i + 1 < len(argv):
                found = argv[i + 1]
    return found or None


def host_port(address: str) -> tuple[str, int]:
    """HOST[:PORT] as torchrun reads --rdzv-endpoint ([v6]:port too; torch's 29400 where it names no port)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or (host.count(":") and not host.startswith("[")):
        return address.strip("[]"), TORCH_PORT
    return host.strip("[]"), int(port)


def main(argv: list[str]) -> int:
    address, why = argv
    import torch.distributed

    dist: Any = torch.distributed  # TCPStore is not in its stubs
    store = dist.TCPStore(*host_port(address), is_master=False, timeout=timedelta(seconds=WAIT_SECONDS))
    store.set(WHY_KEY, why[:MAX_WHY])
    store.add(PLAIN_KEY, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
