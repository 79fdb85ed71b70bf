"""Processes started detached, each in its own session, and stopped as whole sessions.

The session id of a component is its pid, recorded in `pids/<name>.pid`; every descendant (a pod process of the
node agent included) stays in that session unless it calls setsid itself, so `stop_sessions` reaches them all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from localcluster.layout import Layout


def read_pid(layout: Layout, name: str) -> int | None:
    try:
        return int(layout.pid_file(name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap our own children so a zombie does not look alive
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat and stat[1] == sid and stat[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ours(layout: Layout, pid: int) -> bool:
    """Guards against a recycled pid: our processes mention the state dir on their command line."""
    return alive(pid) and str(layout.state) in cmdline(pid)


# Components that exit when the API server goes away for a moment (kube-scheduler exits on what it takes
# for a corrupt cache after an API server restart). A kubelet restarts such static pods; so does this loop.
SUPERVISED = frozenset({"scheduler", "controller-manager", "scheduler-plugins", "kueue"})
_RESTART_LOOP = 'while :; do "$@"; echo "==== exited with $?; restarting in 1 s" >&2; sleep 1; done'


def supervised(name: str, argv: list[str], restart: bool = False) -> list[str]:
    """The command line that runs `argv`, and again whenever it exits, when `name` is supervised."""
    return ["bash", "-c", _RESTART_LOOP, f"supervise-{name}", *argv] if restart or name in SUPERVISED else argv


def start(layout: Layout, name: str, argv: list[str], env: dict[str, str] | None = None,
          restart: bool = False) -> subprocess.Popen:
    """`restart`: run it again whenever it exits, as systemd does a node's kubelet and runtime."""
    argv = supervised(name, argv, restart)
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    with open(layout.log_file(name), "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=layout.root, env=env, start_new_session=True,
        )
    layout.pid_file(name).write_text(f"{proc.pid}\n")
    return proc


def _signal_session(sid: int, sig: int) -> None:
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_sessions(sids: list[int], deadline: float) -> list[int]:
    """SIGTERM every process in the sessions, SIGKILL what is left at the deadline; returns survivors."""
    for sid in sids:
        _signal_session(sid, signal.SIGTERM)
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        left = [pid for sid in sids for pid in session_members(sid) if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    for sid in sids:
        _signal_session(sid, signal.SIGKILL)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        left = [pid for sid in sids for pid in session_members(sid) if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return left


def tail(path: Path, lines: int = 25) -> str:
    """The last lines this run wrote (`start` separates runs with a ==== header)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    headers = [i for i, line in enumerate(text) if line.startswith("==== ")]
    current = text[headers[-1] + 1 :] if headers else text
    return "\n".join(current[-lines:]) or "(empty log)"
