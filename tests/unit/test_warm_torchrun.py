"""`python -m elasticjob_warm.torchrun`: real torchrun (standalone, one node), its server started first.

Seconds, not milliseconds: the agent imports torch. The server preloads `decimal` only (ELASTICJOB_WARM_PRELOAD).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_warm import gated_preload

from helpers import wait_for

REPORT = textwrap.dedent("""
    import json, os, sys
    server = os.getppid()
    with open(f"/proc/{server}/stat") as stat:
        server_parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    json.dump({"server_parent": server_parent, "preloaded": "decimal" in sys.modules, "argv": sys.argv[1:],
               "rank": os.environ["RANK"]}, open(sys.argv[1] + os.environ["LOCAL_RANK"], "w"))
    sys.exit(int(sys.argv[2]))
""")


def torchrun(tmp_path, *argv, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"), ELASTICJOB_WARM_PRELOAD="decimal")
    env.update(env_extra)
    if not env["ELASTICJOB_WARM_SOCKET"]:
        del env["ELASTICJOB_WARM_SOCKET"]
    with open(tmp_path / "log", "w") as log:  # the server keeps the agent's stderr: a pipe would not end
        proc = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--standalone",
                                 "--max-restarts=0", *argv], env=env, stdout=log, stderr=log)
        proc.wait(timeout=120)
    return proc


def test_workers_come_from_the_server_that_the_agent_started(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(REPORT)
    proc = torchrun(tmp_path, "--nproc-per-node=2", str(script), str(tmp_path / "r"), "0")
    assert proc.returncode == 0, (tmp_path / "log").read_text()[-3000:]
    reports = [json.load(open(tmp_path / f"r{i}")) for i in range(2)]
    assert {r["server_parent"] for r in reports} == {proc.pid}  # the agent started it, not a first worker
    assert all(r["preloaded"] for r in reports) and {r["rank"] for r in reports} == {"0", "1"}
    assert reports[0]["argv"] == [str(tmp_path / "r"), "0"]
    # The rendezvous (standalone is c10d's too) ran with the shorter poll, torch calling it as it does.
    assert "rendezvous polled every 0.1 s" in (tmp_path / "log").read_text()


def test_a_failing_worker_fails_the_agent_as_torchrun_would(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(REPORT)
    proc = torchrun(tmp_path, "--nproc-per-node=1", str(script), str(tmp_path / "r"), "3")
    log = (tmp_path / "log").read_text()
    assert proc.returncode == 1 and "exitcode  : 3" in log, log[-3000:]


def test_no_python_runs_as_written_and_says_why_it_is_cold(tmp_path):
    proc = torchrun(tmp_path, "--no-python", "true")
    log = (tmp_path / "log").read_text()
    assert proc.returncode == 0 and "the workers start cold (no warm server): --no-python" in log, log[-3000:]


def test_a_bad_poll_is_refused_before_anything_runs(tmp_path):
    proc = torchrun(tmp_path, "true", ELASTICJOB_RDZV_POLL_SECONDS="soon")
    assert proc.returncode == 2 and "ELASTICJOB_RDZV_POLL_SECONDS='soon'" in (tmp_path / "log").read_text()


def test_the_agent_gives_its_workers_a_socket_nobody_can_guess(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        path = os.environ["ELASTICJOB_WARM_SOCKET"]
        info = os.stat(os.path.dirname(path))
        server = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
        json.dump({"path": path, "mode": info.st_mode & 0o777, "uid": info.st_uid, "server": server,
                   "preloaded": "decimal" in sys.modules}, open(sys.argv[1], "w"))
    """))
    proc = torchrun(tmp_path, "--nproc-per-node=1", str(script), str(tmp_path / "r"), ELASTICJOB_WARM_SOCKET="")
    assert proc.returncode == 0, (tmp_path / "log").read_text()[-3000:]
    report = json.load(open(tmp_path / "r"))
    assert (report["mode"], report["uid"], report["preloaded"]) == (0o700, os.getuid(), True)
    assert str(proc.pid) not in report["path"]  # not the agent's pid: a name made at random
    assert report["path"] in report["server"]  # the server the worker was forked from listens there


def children(pid: int) -> list[str]:
    """The command lines of `pid`'s child processes."""
    lines = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = open(f"/proc/{pid}/task/{task}/children").read().split()
        except FileNotFoundError:
            continue
        for kid in kids:
            try:
                lines.append(open(f"/proc/{kid}/cmdline").read().replace("\0", " "))
            except FileNotFoundError:
                pass
    return lines


def workers(agent: int) -> list[str]:
    """The worker processes torchrun has started (the server is a child of the agent too)."""
    return [c for c in children(agent) if "elasticjob_warm" in c and ".server" not in c]


def test_the_agent_joins_the_rendezvous_only_once_its_server_has_preloaded(tmp_path):
    """A newcomer that joined a running group while its server still imported would stop the whole group
    until its worker could be forked: the agent starts no worker until the server is done."""
    gate, preload = gated_preload(tmp_path)
    script = tmp_path / "job.py"
    script.write_text(REPORT)
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"), **preload)
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--standalone",
                                 "--max-restarts=0", "--nproc-per-node=1", str(script), str(tmp_path / "r"), "0"],
                                env=env, stdout=log, stderr=log)
    try:
        # The agent has imported torch and set itself up (its polls shortened) with the server still importing.
        wait_for(lambda: (tmp_path / "log").read_text(), 60, "the agent set up", until=lambda t: "polled" in t)
        with pytest.raises(AssertionError, match="timed out"):
            wait_for(lambda: workers(proc.pid), 3, "a worker started while the server still imports")
        gate.write_text("go")
        assert proc.wait(timeout=120) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        proc.kill()
    log_text = (tmp_path / "log").read_text()
    assert "workers warm" in log_text and "joining the rendezvous" in log_text, log_text[-3000:]
    assert json.load(open(tmp_path / "r0"))["server_parent"] == proc.pid
