"""Starting a rendezvous store (or its stand-in) as a process on this machine, as the tests need one.

The store listens on ELASTICJOB_RDZV_PORT and its control endpoint on the port after it. A pair picked now can be
taken by another process before the store binds it (importing torch takes seconds, and the integration tier
runs API servers and operators beside the tests), so pairs are drawn below the kernel's ephemeral range, which
no bind(0) or outgoing connection uses, and a store that could not listen is started again on another pair.
A store that exits for any other reason fails the test at once, with its output.
"""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticjob_store.protocol import control_port
from helpers import wait_for

# Below the ephemeral range and below kube's NodePorts (30000+), above the well-known kube ports (10250...).
_LOWEST, _HIGHEST = 20000, 29998
CANNOT_LISTEN = "cannot listen on port"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def free_port_pair() -> int:
    """A free port whose successor is free too, outside the range the kernel hands out on its own."""
    highest = min(_HIGHEST, _ephemeral_low() - 2)
    for _ in range(200):
        port = random.randint(_LOWEST, highest)
        if _bindable(port) and _bindable(control_port(port)):
            return port
    raise AssertionError(f"no two consecutive free ports in {_LOWEST}..{highest + 1}")


class StoreExited(AssertionError):
    pass


def start_store_process(command: list[str], env: dict[str, str], log: Path, ready: Callable[[int], Any],
                        *, timeout: float = 60, attempts: int = 3, **popen: Any) -> tuple[subprocess.Popen, int]:
    """Starts `command` with ELASTICJOB_RDZV_PORT set to a fresh pair and returns it once `ready(port)` is
    truthy. Its stdout and stderr go to `log`."""
    for attempt in range(1, attempts + 1):
        port = free_port_pair()
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, env={**env, "ELASTICJOB_RDZV_PORT": str(port)}, stdout=out,
                                    stderr=subprocess.STDOUT, **popen)

        def observe() -> Any:
            if proc.poll() is not None:
                raise StoreExited(f"the store exited {proc.returncode} before it served:\n{log.read_text()}")
            return ready(port)

        try:
            wait_for(observe, timeout, f"the store on port {port}", ignore=(OSError,))
        except StoreExited:
            if CANNOT_LISTEN in log.read_text() and attempt < attempts:
                continue  # another process took the pair between the pick and the bind
            raise
        except BaseException:
            proc.kill()
            proc.wait(timeout=30)
            raise
        return proc, port
    raise AssertionError("unreachable")
