"""What the node check (elasticjob_warm/nodecheck.py) costs the join, on this machine's CPU.

(a) Seconds from launching `python -m elasticjob_warm.torchrun --standalone` to its line "joining the
rendezvous", with ELASTICJOB_NODE_CHECK=0 and =1, and =1 through the check's own process as on a GPU node
(forced here by a sitecustomize that gives nodecheck.start a device count of 1; with no GPU that process checks
the CPU only, so this is a GPU node's cost without CUDA's). The three alternate run by run, so that a busy
machine weighs on all alike; the differences are what the check adds to the join. (b) The check alone: as the
agent runs it on a node without a GPU (a thread, torch imported already, the process's first matmul), and as
its own process, `python -m elasticjob_warm.nodecheck` (torch's import and the CPU check). Prints a table of
medians [min-max] over --runs runs.

    .venv/bin/python bench/nodecheck.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
from elasticjob_warm import nodecheck  # noqa: E402

JOINING = b"joining the rendezvous"


# Bench-only: the agent takes the GPU nodes' path (nodecheck.start with device_count=1).
AS_ON_A_GPU_NODE = """
import functools
from elasticjob_warm import nodecheck
nodecheck.start = functools.partial(nodecheck.start, device_count=1)
"""


def to_join(tmp: Path, check: str, site: Path | None = None) -> float:
    """Launch to the agent's "joining the rendezvous", read from its stderr as it comes; the agent (and its warm
    server, in the agent's session) is killed then."""
    script = tmp / "job.py"
    script.write_text("")
    sock = tempfile.mkdtemp(dir=tmp) + "/warm.sock"
    path = [str(site) if site else "", str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "ELASTICJOB_WARM_SOCKET": sock, nodecheck.CHECK_ENV: check,
           "PYTHONPATH": os.pathsep.join(filter(None, path))}
    began = time.perf_counter()
    agent = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--standalone", "--nproc-per-node=1",
                              str(script)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    assert agent.stderr is not None
    seen = []
    try:
        for line in agent.stderr:
            seen.append(line)
            if JOINING in line:
                took = time.perf_counter() - began
                if (check == "1") != any(b"node check passed" in earlier for earlier in seen):
                    raise SystemExit(f"ELASTICJOB_NODE_CHECK={check}: the check's line is not as expected:\n"
                                     + b"".join(seen).decode(errors="replace"))
                return took
        raise SystemExit("the agent ended without joining:\n" + b"".join(seen).decode(errors="replace"))
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()


def in_thread() -> float:
    """In a fresh process, torch imported: its first check, as the agent's is (that pays for the thread pool)."""
    done = subprocess.run([sys.executable, "-c", THREAD_RUN], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
    return float(done.stdout)


def as_process() -> float:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "elasticjob_warm.nodecheck"], capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - began


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    via_process: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)  # the warm server's socket wants a private directory
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(AS_ON_A_GPU_NODE)
        for run in range(args.runs):
            off.append(to_join(Path(tmp), "0"))
            on.append(to_join(Path(tmp), "1"))
            via_process.append(to_join(Path(tmp), "1", site))
            print(f"run {run + 1}: to the join {off[-1]:.2f} s without the check, {on[-1]:.2f} s with it, "
                  f"{via_process[-1]:.2f} s with it in its own process", file=sys.stderr, flush=True)
    threaded = [in_thread() for _ in range(args.runs)]
    process = [as_process() for _ in range(args.runs)]
    added = [b - a for a, b in zip(off, on)]
    added_process = [b - a for a, b in zip(off, via_process)]
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; medians [min-max] of {args.runs} runs, seconds\n")
    print("| measured | seconds | |\n|---|---|---|")
    print(f"| (a) agent launch to \"joining the rendezvous\", ELASTICJOB_NODE_CHECK=0 | {cell(off)} | |")
    print(f"| (a) the same, ELASTICJOB_NODE_CHECK=1 | {cell(on)} | "
          f"{statistics.median(on) / statistics.median(off):.3f}x |")
    print(f"| (a) added to the join (=1 minus =0, run by run) | **{cell(added)}** | target ≤ 1 s |")
    print(f"| (a) ELASTICJOB_NODE_CHECK=1 in the check's own process, as on a GPU node (no GPU part here) | "
          f"{cell(via_process)} | {statistics.median(via_process) / statistics.median(off):.3f}x |")
    print(f"| (a) added to the join by that process (run by run) | {cell(added_process)} | |")
    print(f"| (b) the check alone, as the agent runs it (a thread; the process's first matmul) | {cell(threaded)} | |")
    print(f"| (b) the check alone, as its own process (`python -m elasticjob_warm.nodecheck`: torch's import "
          f"and the CPU check) | {cell(process)} | |")
    return 0


# The agent's case: torch imported, then the process's first check, timed from its start to its verdict.
THREAD_RUN = """
import time, torch
from elasticjob_warm import nodecheck
began = time.perf_counter()
passed, line = nodecheck.Check.in_thread(30, nodecheck.check_cpu).verdict()
assert passed, line
print(time.perf_counter() - began)
"""


if __name__ == "__main__":
    sys.exit(main())
