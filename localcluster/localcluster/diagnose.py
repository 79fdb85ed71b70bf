"""What `make run` names when it stops short: pods that cannot start (crash-looping with their last log line,
unschedulable with the scheduler's reason), so a failed story says what it saw wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

# Waiting reasons that mean the container will not run as it is.
STUCK = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "CreateContainerError",
         "CreateContainerConfigError", "RunContainerError", "InvalidImageName"}


def problems(pods: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(namespace/name, what is wrong, the container whose log tells more) for each pod that cannot start."""
    found = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        where = f"{meta['namespace']}/{meta['name']}"
        for c in status.get("containerStatuses") or []:
            waiting = (c.get("state") or {}).get("waiting") or {}
            last = (c.get("lastState") or {}).get("terminated") or {}
            if waiting.get("reason") in STUCK:
                found.append((where, f"container {c['name']}: {waiting['reason']} {waiting.get('message') or ''}"
                              .strip(), c["name"]))
            elif c.get("restartCount", 0) > 0 and last.get("exitCode", 0) != 0:
                found.append((where, f"container {c['name']} restarted {c['restartCount']} times, last exit code "
                              f"{last['exitCode']}", c["name"]))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                found.append((where, f"unschedulable: {cond.get('message') or ''}".strip(), None))
    return found


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def report(api: client.ApiClient) -> list[str]:
    """One line per pod that cannot start, anywhere in the cluster, with its container's last log line."""
    core = client.CoreV1Api(api)
    pods = [api.sanitize_for_serialization(p) for p in core.list_pod_for_all_namespaces().items]
    lines = []
    for where, what, container in problems(pods):
        tail = _log_tail(core, where, container) if container else ""
        lines.append(f"pod {where}: {what}" + (f"; its last log line: {tail}" if tail else ""))
    return lines


def _log_tail(core: client.CoreV1Api, where: str, container: str) -> str:
    namespace, name = where.split("/", 1)
    read: Callable[..., str] = core.read_namespaced_pod_log
    for previous in (True, False):
        try:
            if line := last_line(read(name, namespace, container=container, previous=previous, tail_lines=20)):
                return line
        except client.exceptions.ApiException:
            continue
    return ""
