"""Runs build.sh / build_addons.sh (instant when the binaries are cached) and relays their progress lines.

Both scripts print only the bin dir on stdout (last line) and their progress on stderr: `[build ...] 2m10s
compiled 812/2140 packages (...)`. A cold build takes minutes, so every stderr line goes to `log` as it comes, and
a heartbeat when the script is quiet for 30 seconds (downloading modules, linking).
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

Log = Callable[[str], None]
HEARTBEAT_SECONDS = 30.0


def run(script: Path, args: list[str], what: str, log: Log) -> Path:
    """Runs `bash script args...` and returns the bin dir it printed; raises with the script's exit code."""
    script = script.resolve()
    proc = subprocess.Popen(["bash", str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=script.parent)
    assert proc.stdout is not None and proc.stderr is not None
    started = time.monotonic()
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    pending = b""
    while True:
        if not selector.select(timeout=HEARTBEAT_SECONDS):
            log(f"  still building {what} ({time.monotonic() - started:.0f}s)")
            continue
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            log(f"  {line.decode(errors='replace')}")
    if pending:
        log(f"  {pending.decode(errors='replace')}")
    out = proc.stdout.read().decode()
    proc.wait()
    selector.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed with exit code {proc.returncode}")
    return Path(out.strip().splitlines()[-1])


def bin_dir(script: Path) -> Path:
    """Where the script keeps (or will keep) its binaries, without building anything."""
    out = subprocess.run(["bash", str(script), "--bin-dir"], capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])
