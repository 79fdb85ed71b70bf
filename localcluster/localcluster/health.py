"""Health of the local cluster's components, and the few API reads `up` waits on."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from localcluster import sessions
from localcluster.layout import Endpoints, Layout

Log = Callable[[str], None]


@dataclass
class Health:
    ok: bool
    detail: str


def admin_context(layout: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return ctx


def insecure_context() -> ssl.SSLContext:
    # The controller-manager and scheduler serve /healthz with a self-signed cert generated in memory.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3.0) -> Health:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as response:
            return Health(response.status == 200, response.read().decode(errors="replace").strip()[:200])
    except urllib.error.HTTPError as err:
        return Health(False, f"HTTP {err.code}: {err.read().decode(errors='replace').strip()[-300:]}")
    except (OSError, ssl.SSLError) as err:
        return Health(False, str(getattr(err, "reason", err)))


def check(endpoints: Endpoints, name: str) -> Health:
    ports = endpoints.ports
    if name == "etcd":
        return get(f"http://127.0.0.1:{ports['etcd']}/health")
    if name == "apiserver":
        return get(f"{endpoints.server}/readyz", admin_context(endpoints.layout))
    if name in ("controller-manager", "scheduler", "scheduler-plugins"):
        return get(f"https://127.0.0.1:{ports[name]}/healthz", insecure_context())
    if name == "kueue":
        # Ready once its webhook server serves (and the certificates are in place).
        return get(f"http://127.0.0.1:{ports['kueue-health']}/readyz")
    if name == "kwok":
        return get(f"http://127.0.0.1:{ports['kwok']}/healthz")
    if name == "nodeagent":
        return Health(True, "process running")
    raise ValueError(name)


def api_json(endpoints: Endpoints, path: str) -> dict:
    with urllib.request.urlopen(f"{endpoints.server}{path}", context=admin_context(endpoints.layout), timeout=5) as r:
        return json.loads(r.read())


def ready_nodes(endpoints: Endpoints) -> list[str]:
    ready = []
    for node in api_json(endpoints, "/api/v1/nodes").get("items", []):
        conditions = node.get("status", {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready.append(node["metadata"]["name"])
    return ready


def wait_healthy(endpoints: Endpoints, name: str, proc: subprocess.Popen, timeout: float, log: Log) -> None:
    started = time.monotonic()
    last = Health(False, "not probed")
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{name} exited with code {proc.returncode}; log {endpoints.layout.log_file(name)}:\n"
                f"{sessions.tail(endpoints.layout.log_file(name))}"
            )
        last = check(endpoints, name)
        if last.ok:
            log(f"  {name} ready ({time.monotonic() - started:.1f}s)")
            return
        time.sleep(0.25)
    raise RuntimeError(
        f"{name} not healthy after {timeout:.0f}s (last: {last.detail}); log tail:\n"
        f"{sessions.tail(endpoints.layout.log_file(name))}"
    )


