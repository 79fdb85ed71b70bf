"""Optional components started after the control plane and the nodes: scheduler-plugins' scheduler, Kueue, and
kwok's fake nodes.

Each add-on module (schedplugins_addon.py, kueue_addon.py, kwok_addon.py) provides NAME, BINARY, PORTS,
HEALTHY_WITHIN and three steps: `prepare(endpoints)` (CRDs, RBAC, certificates, configuration, kwok's Nodes; before
the process, as Kueue exits when what it needs is missing), `argv(bin_dir, endpoints)`, and `finish(endpoints, log)`
once the process is healthy (Kueue's webhooks and default queues); optionally `cleanup(endpoints, log)` after
`localcluster stop NAME` stopped it (kwok deletes its Nodes). Their binaries come from build_addons.sh, built only
when an add-on is asked for.

(Module names here must not be those of directories in localcluster/ (kueue/, schedplugins/, manifests/, cmd/):
`python -m` from the repository root would import those directories as namespace packages instead.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

from localcluster import builds, components, kueue_addon, kwok_addon, schedplugins_addon, sessions
from localcluster.health import Health, check, wait_healthy
from localcluster.layout import Endpoints, Layout, record, recorded_nodes

Log = Callable[[str], None]
# In start order; `down` stops them before everything else.
ADDONS: dict[str, ModuleType] = {schedplugins_addon.NAME: schedplugins_addon, kueue_addon.NAME: kueue_addon,
                                  kwok_addon.NAME: kwok_addon}
STOP_GRACE_SECONDS = 20.0


def check_names(names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    unknown = [name for name in names if name not in ADDONS]
    if unknown:
        raise RuntimeError(f"unknown add-on(s) {', '.join(unknown)}; known: {', '.join(ADDONS)}")
    return [name for name in ADDONS if name in names]


def ensure_binaries(layout: Layout, names: list[str], log: Log) -> Path:
    """Builds the add-ons' binaries that are missing (minutes the first time, relaying progress), else instant."""
    binaries = [ADDONS[name].BINARY for name in names]
    return builds.run(layout.addons_build_script, binaries, " and ".join(names), log)


def running(layout: Layout, endpoints: Endpoints, name: str) -> Health:
    pid = sessions.read_pid(layout, name)
    if pid is None or not sessions.ours(layout, pid):
        return Health(False, "not running")
    return check(endpoints, name)


def _start(layout: Layout, endpoints: Endpoints, name: str, bin_dir: Path, log: Log) -> None:
    module = ADDONS[name]
    started = time.monotonic()
    missing = {port_name: port for port_name, port in module.PORTS.items() if port_name not in endpoints.ports}
    if missing:
        endpoints.ports.update(components.choose_ports(None, missing))
        record(layout, endpoints, recorded_nodes(layout))
    module.prepare(endpoints)
    proc = sessions.start(layout, name, module.argv(bin_dir, endpoints))
    wait_healthy(endpoints, name, proc, module.HEALTHY_WITHIN, log)
    module.finish(endpoints, log)
    log(f"  {name} up ({time.monotonic() - started:.1f}s)")


def _stop(layout: Layout, name: str) -> None:
    pid = sessions.read_pid(layout, name)
    if pid is not None and sessions.ours(layout, pid):
        sessions.stop_sessions([pid], STOP_GRACE_SECONDS)
    layout.pid_file(name).unlink(missing_ok=True)


def stop(layout: Layout, endpoints: Endpoints, name: str, log: Log) -> None:
    """Stops one add-on of a running cluster and undoes what it registered (kwok's Nodes); the rest stays."""
    _stop(layout, name)
    log(f"  stopped {name}")
    cleanup = getattr(ADDONS[name], "cleanup", None)
    if cleanup is not None:
        cleanup(endpoints, log)


def ensure(layout: Layout, endpoints: Endpoints, names: list[str], log: Log) -> None:
    """Starts each named add-on that is not running and healthy; a dead or unhealthy one is started afresh.
    An add-on that fails to come up is stopped again and the error raised."""
    todo = []
    for name in names:
        health = running(layout, endpoints, name)
        if health.ok:
            log(f"  {name} already running")
            continue
        if layout.pid_file(name).exists():
            log(f"  {name} is not healthy ({health.detail}): starting it afresh (log {layout.log_file(name)})")
            _stop(layout, name)
        todo.append(name)
    if not todo:
        return
    bin_dir = ensure_binaries(layout, todo, log)
    for name in todo:
        log(f"  starting {name}")
        try:
            _start(layout, endpoints, name, bin_dir, log)
        except BaseException:
            _stop(layout, name)
            raise
