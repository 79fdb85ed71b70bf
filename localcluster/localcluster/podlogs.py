"""Container logs from the state dir (`kubectl logs` needs a kubelet server, which the local nodes do not run)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import launcher, state


def find_pod_dir(state_dir: Path, namespace: str, pod: str) -> Path:
    """The newest pod of that name: a pod re-created under the same name has a new uid and a new dir."""
    candidates = sorted(state.pods_root(state_dir).glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime)
    exact = [p for p in candidates if p.name.rsplit("_", 1)[0] == f"{namespace}_{pod}"]
    if not exact:
        raise FileNotFoundError(f"no logs for pod {namespace}/{pod} under {state_dir}")
    return exact[-1]


def container_name(pod_dir: Path, container: str | None) -> str:
    if container:
        return container
    names = state.read_json(state.runtime_file(pod_dir), {}).get("containers") or []
    if names:
        return names[0]  # kubectl's default: the first container
    raise FileNotFoundError(f"no containers recorded in {pod_dir}")


def read(state_dir, namespace: str, pod: str, container: str | None = None, previous: bool = False) -> str:
    pod_dir = find_pod_dir(Path(state_dir), namespace, pod)
    name = container_name(pod_dir, container)
    path = state.previous_log_file(pod_dir, name) if previous else state.log_file(pod_dir, name)
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def follow(state_dir, namespace: str, pod: str, container: str | None = None, out=sys.stdout) -> None:
    """Print the log and what is appended to it, until the container is gone (or interrupted)."""
    pod_dir = find_pod_dir(Path(state_dir), namespace, pod)
    name = container_name(pod_dir, container)
    path, pid_file = state.log_file(pod_dir, name), state.pid_file(pod_dir, name)
    offset = 0
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            out.write(chunk.decode(errors="replace"))
            out.flush()
        elif not launcher.signal_container(pid_file, 0):
            return
        else:
            time.sleep(0.5)  # polling a file for appended output; nothing to synchronise with
