"""Start one container process through the shim, and signal a running one by its recorded pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import containers, state
from .images import ImageConfig

SHIM = Path(__file__).with_name("shim.py")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Sandbox:
    """What the containers of one pod share: its state dir, netns (None with hostNetwork) and IP."""

    path: Path
    netns: str | None
    ip: str


def read_pid(pid_path: Path) -> tuple[int, str, int] | None:
    """(container PID 1 on the host, its pid namespace, the shim's pid)."""
    try:
        pid, ns, *shim = Path(pid_path).read_text().split()
        return int(pid), ns, int(shim[0]) if shim else 0
    except (FileNotFoundError, ValueError):
        return None


def shim_alive(pid: int) -> bool:
    try:
        return str(SHIM).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def signal_container(pid_path: Path, sig: int) -> bool:
    """Signal the container's PID 1 if it is still the process the shim recorded (same PID namespace)."""
    recorded = read_pid(pid_path)
    if recorded is None:
        return False
    pid, ns, _ = recorded
    try:
        if os.readlink(f"/proc/{pid}/ns/pid") != ns:
            return False
        os.kill(pid, sig)
        return True
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


class ContainerProcess:
    def __init__(self, proc: subprocess.Popen, pid_path: Path):
        self.proc = proc
        self.pid_path = pid_path

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        return 128 - rc if rc < 0 else rc  # the shim itself killed by a signal: report it as the container's

    def host_pid(self, wait: float = 2.0) -> int | None:
        deadline = time.monotonic() + wait
        while True:
            recorded = read_pid(self.pid_path)
            if recorded:
                return recorded[0]
            if time.monotonic() >= deadline or self.poll() is not None:
                return None
            time.sleep(0.02)  # the shim writes the pid file within milliseconds of starting

    def signal(self, sig: int) -> None:
        if not signal_container(self.pid_path, sig) and sig == 9 and self.proc.poll() is None:
            self.proc.kill()  # the shim is the parent: killing it kills the namespace via PDEATHSIG

    def wait(self) -> int:
        self.proc.wait()
        return self.poll()


class AdoptedProcess(ContainerProcess):
    """A container an earlier agent started: its shim is no longer our child, so watch it through /proc."""

    def __init__(self, shim_pid: int, pid_path: Path, exit_path: Path):
        self.shim_pid, self.pid_path, self.exit_path = shim_pid, pid_path, exit_path

    def poll(self) -> int | None:
        if shim_alive(self.shim_pid):
            return None
        try:
            return int(self.exit_path.read_text())
        except (FileNotFoundError, ValueError):
            return 137  # the shim was killed before it could write the status

    def signal(self, sig: int) -> None:
        if not signal_container(self.pid_path, sig) and sig == 9 and shim_alive(self.shim_pid):
            os.kill(self.shim_pid, sig)

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.05)  # not our child: nothing to wait() on
        return code


def adopt(pod_path: Path, name: str) -> AdoptedProcess | None:
    recorded = read_pid(state.pid_file(pod_path, name))
    if recorded is None or not shim_alive(recorded[2]):
        return None
    return AdoptedProcess(recorded[2], state.pid_file(pod_path, name), state.exit_file(pod_path, name))


def base_env(pod: dict) -> dict[str, str]:
    venv_bin = Path(sys.executable).parent  # the agent runs from the repo's .venv; pods use the same tools
    return {
        "PATH": f"{venv_bin}:{SYSTEM_PATH}",
        "HOME": "/root",
        "HOSTNAME": pod["metadata"]["name"],
        "VIRTUAL_ENV": str(venv_bin.parent),
    }


def launch(pod: dict, spec: dict, sandbox: Sandbox, env: dict[str, str], volumes: dict[str, str], repo_root: Path,
           restarting: bool, image: ImageConfig | None = None) -> ContainerProcess:
    name = spec["name"]
    path = sandbox.path
    argv = containers.command_line(spec, env, image)
    term = state.termination_file(path, name)
    term.write_text("")
    hosts = path / "hosts"
    hosts.write_text(containers.hosts_text(pod["metadata"]["name"], sandbox.ip))
    hosts.with_name("resolv.conf").write_text(containers.RESOLV_CONF)
    log = state.log_file(path, name)
    if restarting and log.exists():
        os.replace(log, state.previous_log_file(path, name))
    pid_path = state.pid_file(path, name)
    pid_path.unlink(missing_ok=True)
    state.exit_file(path, name).unlink(missing_ok=True)
    shim_spec = {
        "netns": f"/run/netns/{sandbox.netns}" if sandbox.netns else None,
        "hostname": pod["metadata"]["name"],
        "command": argv,
        "env": env,
        "workdir": spec.get("workingDir") or str(repo_root),
        "mounts": containers.mounts(spec, volumes, term, hosts, workspace=repo_root),
        # The repository and the agent's venv stand in for the image: a volume over their folder must not hide them.
        "keep": sorted({str(repo_root), str(Path(sys.executable).parent.parent)}),
        "pid_file": str(pid_path),
        "exit_file": str(state.exit_file(path, name)),
    }
    spec_path = path / f"{name}.spec.json"
    state.write_json(spec_path, shim_spec)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-S", str(SHIM), str(spec_path)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, close_fds=True)
    return ContainerProcess(proc, pid_path)


def log_tail(path: Path, name: str, limit: int = 4096) -> str:
    log = state.log_file(path, name)
    try:
        with open(log, "rb") as f:
            f.seek(max(0, log.stat().st_size - limit))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
