"""The plain-torchrun notice (elasticjob_warm/notice.py) ends with the agent that started it: detached, it waited
its 15 minutes for a store after the agent left (a CI run found one left behind by a failed node check)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def test_the_notice_ends_when_its_agent_does():
    # The "agent": starts the notice detached (as torchrun.plain does) for a store nobody serves, prints its pid,
    # and leaves once the notice is running.
    agent = subprocess.run([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'elasticjob_warm.notice', '127.0.0.1:9', 'test'],"
        " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "time.sleep(1.0)\n"  # the notice sets its parent-death signal first thing; then the agent leaves
        "print(p.pid)\n")], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
    pid = int(agent.stdout.split()[-1])
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    still = alive(pid)
    if still:
        os.kill(pid, 9)
    assert not still, "the notice outlived its agent"
