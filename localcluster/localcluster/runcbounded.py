#!/usr/bin/python3
"""runc for Docker where the host's capability bounding set lacks some capability, as this machine's does.

A privileged container (every kind node) asks runc for every capability Docker knows; where the bounding set of
Docker's own process lacks one (here CAP_SYS_RESOURCE), runc stops with "unable to apply caps: operation not
permitted" and kind cannot start a node. containerd (inside the kind node) asks for the current process's
capabilities instead and needs nothing of this.

Docker runs this file as its default runtime (localcluster/container-engine.sh registers it): for runc's `create`,
`run` and `exec` it removes from the container's capability sets those the bounding set lacks, then hands every
argument to the real runc unchanged. Where nothing is missing (a usual host) it changes nothing.

Standard library only: Docker runs it with the system's python3, outside the project's environment.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

RUNC = "/usr/sbin/runc"
CAP_SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")
# Linux's capability numbers (capability.h), as runc's config names them.
CAP_NAMES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)


def bounding_set(status_text: str) -> set[str]:
    """The capability names in /proc/self/status's CapBnd mask (numbers past CAP_NAMES are left out)."""
    mask = next(int(line.split()[1], 16) for line in status_text.splitlines() if line.startswith("CapBnd:"))
    return {name for bit, name in enumerate(CAP_NAMES) if mask >> bit & 1}


def missing(status_text: str) -> set[str]:
    """The capabilities this kernel knows (numbers up to cap_last_cap are all in CAP_NAMES here) that the
    bounding set lacks."""
    return set(CAP_NAMES) - bounding_set(status_text)


def bounded(capabilities: dict[str, list[str]], absent: set[str]) -> dict[str, list[str]]:
    """The capability sets without the absent ones; order and unknown keys kept."""
    return {key: [c for c in value if c not in absent] if key in CAP_SETS else value
            for key, value in capabilities.items()}


def spec_file(argv: Sequence[str]) -> tuple[Path, str] | None:
    """Where runc will read capabilities for this call: the bundle's config.json (its process under "process"),
    or an exec's process file (the process itself). None for every other command."""
    for flag, name, key in (("--bundle", "config.json", "process"), ("-b", "config.json", "process"),
                            ("--process", "", ""), ("-p", "", "")):
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                return Path(argv[i + 1]) / name if name else Path(argv[i + 1]), key
            if arg.startswith(flag + "=") and flag.startswith("--"):
                value = arg.split("=", 1)[1]
                return Path(value) / name if name else Path(value), key
    return None


def rewrite(path: Path, key: str, absent: set[str]) -> bool:
    """Removes the absent capabilities from the file's process; True when it changed the file."""
    document = json.loads(path.read_text())
    process = document.get(key) if key else document
    if not isinstance(process, dict) or not isinstance(process.get("capabilities"), dict):
        return False
    before = process["capabilities"]
    after = bounded(before, absent)
    if after == before:
        return False
    process["capabilities"] = after
    path.write_text(json.dumps(document))
    return True


def main(argv: list[str]) -> None:
    absent = missing(Path("/proc/self/status").read_text())
    target = spec_file(argv)
    if absent and target is not None and target[0].exists():
        rewrite(target[0], target[1], absent)
    os.execv(RUNC, [RUNC, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
