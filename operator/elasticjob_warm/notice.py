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


def main(argv: list[str]) -> int:
    address, why = argv
    host, _, port = address.rpartition(":")
    import torch.distributed

    dist: Any = torch.distributed  # TCPStore is not in its stubs
    store = dist.TCPStore(host.strip("[]") or address, int(port or 29400), is_master=False,
                          timeout=timedelta(seconds=WAIT_SECONDS))
    store.set(WHY_KEY, why[:MAX_WHY])
    store.add(PLAIN_KEY, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
