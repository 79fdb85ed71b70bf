"""Readiness and liveness probes of type tcpSocket, httpGet and exec, with the kubelet's thresholds and period.

Readiness marks a container ready or not. Liveness, after `failureThreshold` failures in a row, has the
container killed and restarted by its pod's restartPolicy, as a kubelet does. Startup probes are not run.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request


def resolve_port(port, container: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"unknown named port {port}")


def check(probe: dict, container: dict, pod_ip: str, pid: int | None, env: dict) -> str | None:
    """None when the probe passes, else why it failed (in the words a kubelet's Unhealthy Event uses)."""
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "tcpSocket" in probe:
            port = resolve_port(probe["tcpSocket"]["port"], container)
            with socket.create_connection((pod_ip, port), timeout=timeout):
                return None
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{pod_ip}:{resolve_port(get['port'], container)}{get.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    return None if 200 <= resp.status < 400 else f"HTTP probe failed with statuscode: {resp.status}"
            except urllib.error.HTTPError as err:
                return f"HTTP probe failed with statuscode: {err.code}"
        if "exec" in probe and pid:
            # Enter the container's namespaces, as `kubectl exec` would.
            argv = ["nsenter", "-t", str(pid), "-m", "-n", "-p", "-u", "--", *probe["exec"]["command"]]
            done = subprocess.run(argv, env=env, capture_output=True, timeout=timeout)
            return None if done.returncode == 0 else f"command exited with {done.returncode}"
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        return f"{type(err).__name__}: {err}"
    return "unsupported probe"


def run_probe(probe: dict, container: dict, pod_ip: str, pid: int | None, env: dict) -> bool:
    return check(probe, container, pod_ip, pid, env) is None


class _Prober:
    """When a probe is due, and its passes and failures in a row."""

    def __init__(self, probe: dict | None):
        self.probe = probe
        self.started = time.monotonic()
        self.next_at = self.started + (probe or {}).get("initialDelaySeconds", 0)
        self.passes = self.fails = 0

    def due(self) -> bool:
        return self.probe is not None and time.monotonic() >= self.next_at

    def _count(self, ok: bool) -> None:
        # A shorter period than the kubelet's 10 s default keeps local scenarios fast; an explicit period wins.
        self.next_at = time.monotonic() + max(1, (self.probe or {}).get("periodSeconds", 2))
        self.passes, self.fails = (self.passes + 1, 0) if ok else (0, self.fails + 1)


class Readiness(_Prober):
    """One container's readiness: ready at start when it has no probe, else after successThreshold passes."""

    def __init__(self, probe: dict | None):
        super().__init__(probe)
        self.ready = probe is None

    def record(self, ok: bool) -> bool:
        """Returns whether readiness changed."""
        self._count(ok)
        probe = self.probe or {}
        before = self.ready
        if ok and self.passes >= probe.get("successThreshold", 1):
            self.ready = True
        elif not ok and self.fails >= probe.get("failureThreshold", 3):
            self.ready = False
        return before != self.ready


class Liveness(_Prober):
    """One container's liveness: after failureThreshold failures in a row the container is to be restarted."""

    def record(self, ok: bool) -> bool:
        """Returns whether the container must now be killed (and restarted as its restartPolicy says)."""
        self._count(ok)
        return not ok and self.fails >= (self.probe or {}).get("failureThreshold", 3)
