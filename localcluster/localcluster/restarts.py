"""Restart one component of a running local cluster, as an outage would: watches break, clients reconnect.

Used by the soak and the watch-gap tests. etcd keeps its data across the restart; kube-apiserver starts with
an empty watch cache, so a client resuming an old watch gets 410 Gone and must list again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from localcluster import components, controlplane, sessions
from localcluster.health import wait_healthy
from localcluster.layout import Layout, load_endpoints

ARGV = {
    "etcd": components.etcd_argv,
    "apiserver": components.apiserver_argv,
    "controller-manager": components.controller_manager_argv,
    "scheduler": components.scheduler_argv,
}
HEALTHY_WITHIN = {"etcd": 30.0, "apiserver": 120.0, "controller-manager": 60.0, "scheduler": 60.0}


def restart(root: Path, name: str, down_seconds: float = 0.0, log: Callable[[str], None] = print) -> float:
    """Stop the component, keep it down `down_seconds`, start it again and wait until it is healthy.
    Returns the seconds it was unavailable."""
    layout = Layout(root.resolve())
    endpoints = load_endpoints(layout)
    if endpoints is None or name not in ARGV:
        raise RuntimeError(f"cannot restart {name!r}: no running local cluster, or not a control-plane component")
    bin_dir = controlplane.ensure_binaries(layout.root, log)
    started = time.monotonic()
    pid = sessions.read_pid(layout, name)
    if pid is not None:
        sessions.stop_sessions([pid], controlplane.STOP_GRACE_SECONDS)
    if down_seconds:
        time.sleep(down_seconds)  # an outage of that length, on purpose
    proc = sessions.start(layout, name, ARGV[name](bin_dir, endpoints))
    wait_healthy(endpoints, name, proc, HEALTHY_WITHIN[name], log)
    return time.monotonic() - started
