"""One container: join the pod's netns, make private PID/mount/UTS namespaces, bind the volumes, exec the
command.

Run as `python -S shim.py SPEC.json` (stdlib only, so it starts fast). The command becomes PID 1 of its own PID
namespace, so killing it kills the whole process tree (torchrun's workers included), as a container runtime does.
This process stays outside as the command's parent, writes "<command's host pid> <pid ns> <own pid>" to `pid_file`,
and exits with the command's status (signals mapped to 128+n), also written to `exit_file`. `unshare(1)` would do
the same but misreports signal deaths (util-linux 2.38: "sigprocmask unblock failed", exit 1 instead of 137).
"""

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, None), f"mount {source} on {target}")


def enter_namespaces(spec: dict) -> None:
    if spec.get("netns"):
        fd = os.open(spec["netns"], os.O_RDONLY)
        check(libc.setns(fd, CLONE_NEWNET), "setns")
        os.close(fd)
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS), "unshare")
    # Private propagation keeps the binds below out of the host's mount table.
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def bind(source: str, target: str, is_file: bool, read_only: bool) -> None:
    if is_file:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    else:
        os.makedirs(target, exist_ok=True)
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def bind_all(mounts: list, keep: list) -> None:
    """Every source is opened before anything is bound: a volume mounted over an ancestor of the others (the
    chart's emptyDir on /tmp, with the repository and the cluster's state under /tmp/...) would hide them. The
    `keep` paths (the repository, which stands in for the image) are bound back where a volume covered them."""
    opened = [(m, os.open(m["source"], os.O_PATH), m.get("file") or os.path.isfile(m["source"])) for m in mounts]
    kept = [(path, os.open(path, os.O_PATH)) for path in keep]
    for m, fd, is_file in opened:
        bind(f"/proc/self/fd/{fd}", m["target"], is_file, m.get("readOnly", False))
        os.close(fd)
    for path, fd in kept:
        if not _same(path, fd):
            bind(f"/proc/self/fd/{fd}", path, False, False)
        os.close(fd)


def _same(path: str, fd: int) -> bool:
    try:
        here, there = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def become_container(spec: dict) -> None:
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    hostname = spec.get("hostname", "").encode()
    if hostname:
        check(libc.sethostname(hostname, len(hostname)), "sethostname")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    bind_all(spec.get("mounts", []), spec.get("keep", []))
    os.chdir(spec["workdir"])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    os.execvpe(spec["command"][0], spec["command"], spec["env"])


def exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    enter_namespaces(spec)
    gate_read, gate_write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(gate_write)
            os.read(gate_read, 1)  # wait until the parent has recorded us, so the pid file never names a dead ns
            os.close(gate_read)
            become_container(spec)
        except Exception as exc:  # noqa: BLE001 - any failure here means the container could not start
            print(f"localcluster: cannot start container: {exc}", file=sys.stderr, flush=True)
            os._exit(127 if isinstance(exc, FileNotFoundError) else 128)
    os.close(gate_read)
    ns = os.readlink(f"/proc/{child}/ns/pid")
    tmp = spec["pid_file"] + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{child} {ns} {os.getpid()}\n")
    os.replace(tmp, spec["pid_file"])
    os.close(gate_write)
    # Only the agent signals the container; the shim just waits so it can report the real status.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, status = os.waitpid(child, 0)
    code = exit_code(status)
    # A restarted agent is not this process's parent: it learns the status from this file.
    with open(spec["exit_file"], "w") as f:
        f.write(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
