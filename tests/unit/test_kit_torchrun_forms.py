"""Whatever torchrun accepts, the kit runs: each of torchrun's argument forms through the kit's real launcher and
a real agent (`elasticjob_warm.torchrun`), warm where a warm server can fork the workers, else as written, and
the job's store told why (notice.py). Seconds a case: each agent imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from elasticjob_kit import install
from elasticjob_warm import notice
from helpers import wait_for

# The worker: says who started it (a warm server forks its workers) and what arguments it got.
REPORT = textwrap.dedent("""
    import json, os, sys
    parent = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
    json.dump({"argv": sys.argv[1:], "warm": "elasticjob_warm.server" in parent}, open(sys.argv[1], "w"))
""")
PY = sys.executable
S, M = "{script}", "{out}"  # filled in per test: the script's absolute path, the report's path


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("kit")
    install.install(dest, None)
    return dest


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)


@pytest.mark.parametrize(("argv", "warm", "script_args"), [
    (["torchrun", "--standalone", "--nproc-per-node=1", S, M], True, []),
    (["torchrun", "--standalone", "-m", "report", M, "--no-python"], True, ["--no-python"]),  # the module's own
    ([PY, "-m", "torch.distributed.run", "--standalone", S, M], True, []),
    (["torchrun", "--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint={endpoint}", "--rdzv-id=forms",
      "--rdzv-conf=is_host=false", "--max-restarts", "0", "-t", "3", S, M, "--nnodes", "3", "-m", "x"], True,
     ["--nnodes", "3", "-m", "x"]),
    (["torchrun", "--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint={endpoint}", "--rdzv-id=forms",
      "--rdzv-conf=is_host=false", "--no-python", PY, "-c", REPORT, M], False, []),
    (["torchrun", "--standalone", "--run-path", S, M], False, []),
])
def test_every_torchrun_form_runs_warm_or_as_written(kit, store, tmp_path, argv, warm, script_args):
    script, out = tmp_path / "report.py", tmp_path / "out.json"  # report.py is module `report` too (cwd)
    script.write_text(REPORT)
    argv = [a.format(script=script, out=out, endpoint=f"127.0.0.1:{store.port}") if a != REPORT else a
            for a in argv]
    venv_bin = str(Path(PY).parent)
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "ELASTICJOB_WARM_PRELOAD": "decimal", "HOME": str(tmp_path)}
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.run([str(kit / "bin/launch"), *argv], cwd=tmp_path, env=env, stdout=log, stderr=log,
                              timeout=120)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 0, text[-3000:]
    report = json.loads(out.read_text())
    assert report == {"argv": [str(out), *script_args], "warm": warm}, text[-3000:]
    if not warm:
        assert "the workers start cold (no warm server)" in text, text[-3000:]
    if not warm and "--rdzv-id=forms" in argv:
        # The operator learns it through the job's store (the agent's rendezvous endpoint), as from plain().
        wait_for(lambda: store.check([notice.PLAIN_KEY]), 30, "the agent's notice in the store")
        assert b"--no-python" in store.get(notice.WHY_KEY)
