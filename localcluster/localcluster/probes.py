"""Readiness probes of type tcpSocket, httpGet and exec, with the kubelet's thresholds and period."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request


def resolve_port(port, container: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"unknown named port {port}")


def run_probe(probe: dict, container: dict, pod_ip: str, pid: int | None, env: dict) -> bool:
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "tcpSocket" in probe:
            port = resolve_port(probe["tcpSocket"]["port"], container)
            with socket.create_connection((pod_ip, port), timeout=timeout):
                return True
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{pod_ip}:{resolve_port(get['port'], container)}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return 200 <= resp.status < 400
        if "exec" in probe and pid:
            # Enter the container's namespaces, as `kubectl exec` would.
            argv = ["nsenter", "-t", str(pid), "-m", "-n", "-p", "-u", "--", *probe["exec"]["command"]]
            return subprocess.run(argv, env=env, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False
    return False


class Readiness:
    """One container's readiness: ready at start when it has no probe, else after successThreshold passes."""

    def __init__(self, probe: dict | None):
        self.probe = probe
        self.ready = probe is None
        self.started = time.monotonic()
        self.next_at = self.started + (probe or {}).get("initialDelaySeconds", 0)
        self.passes = self.fails = 0

    def due(self) -> bool:
        return self.probe is not None and time.monotonic() >= self.next_at

    def record(self, ok: bool) -> bool:
        """Returns whether readiness changed."""
        probe = self.probe or {}
        # A shorter period than the kubelet's 10 s default keeps local scenarios fast; an explicit period wins.
        self.next_at = time.monotonic() + max(1, probe.get("periodSeconds", 2))
        self.passes, self.fails = (self.passes + 1, 0) if ok else (0, self.fails + 1)
        before = self.ready
        if ok and self.passes >= probe.get("successThreshold", 1):
            self.ready = True
        elif not ok and self.fails >= probe.get("failureThreshold", 3):
            self.ready = False
        return before != self.ready
