"""`python -m elasticjob_warm.torchrun` on a torch it was not tested on runs plain torchrun, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import run
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

from elasticjob_store import compat as store_compat
from elasticjob_warm import compat, notice

# Under `make compat` on a torch outside the range (tests/compat/run.py) the degraded tests still run; these not.
in_range_only = pytest.mark.skipif(os.environ.get("COMPAT_EXPECT") == "off", reason="this torch is outside the range")
REPORT = textwrap.dedent("""
    import json, os, sys
    json.dump({"parent": os.getppid(), "preloaded": "decimal" in sys.modules}, open(sys.argv[1], "w"))
""")
# Before the wrapper's main: torch's package metadata names another version.
OTHER_VERSION = textwrap.dedent("""
    import importlib.metadata as metadata
    real = metadata.version
    metadata.version = lambda name: "2.99.0" if name == "torch" else real(name)
""")


def torchrun(tmp_path, sitecustomize: str | None) -> tuple[subprocess.CompletedProcess, dict, str]:
    site = tmp_path / "site"
    site.mkdir()
    if sitecustomize:
        (site / "sitecustomize.py").write_text(sitecustomize)
    script = tmp_path / "job.py"
    script.write_text(REPORT)
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"), ELASTICJOB_WARM_PRELOAD="decimal",
               PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    with open(tmp_path / "log", "w") as log:  # the server keeps the agent's stderr: a pipe would not end
        proc = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--standalone",
                                 "--max-restarts=0", "--nproc-per-node=1", str(script), str(tmp_path / "r")],
                                env=env, stdout=log, stderr=log)
        proc.wait(timeout=120)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 0, text[-3000:]
    return proc, json.load(open(tmp_path / "r")), text


def test_an_unknown_torch_runs_plain_torchrun(tmp_path):
    proc, report, log = torchrun(tmp_path, OTHER_VERSION)
    assert "running plain torchrun" in log and "2.99.0 is outside" in log
    # torchrun's own worker: a child of the agent (this very process, exec'd), nothing preloaded, no poll patch.
    assert report == {"parent": proc.pid, "preloaded": False}
    assert "rendezvous polled every" not in log and not (tmp_path / "warm.sock").exists()


@in_range_only
def test_a_known_torch_runs_warm(tmp_path):
    proc, report, log = torchrun(tmp_path, None)
    assert report["preloaded"] and report["parent"] != proc.pid
    assert "running plain torchrun" not in log


@in_range_only
def test_this_torch_passes_every_check():
    assert compat.version_problem(compat.torch_version()) is None
    assert compat.agent_problem(run) is None and compat.polling_problem(rdzv) is None


def test_a_torchrun_without_a_field_we_set_is_refused(monkeypatch):
    real = run.parse_args

    def parse_args(argv):
        args = real(argv)
        del args.module
        return args

    monkeypatch.setattr(run, "parse_args", parse_args)
    assert "lack module" in compat.agent_problem(run)


def test_a_delay_by_another_name_is_not_patched(monkeypatch):
    monkeypatch.setattr(rdzv, "_delay", lambda secs: None)
    assert "_delay(seconds)" in compat.polling_problem(rdzv)


@pytest.mark.parametrize("version, problem", [("2.13.0+cpu", None), ("2.5.1+cu124", "outside"),
                                              ("2.14.0", "outside"), ("", "unknown")])
def test_the_version_alone_decides_first(version, problem):
    found = compat.version_problem(version)
    assert (found is None) if problem is None else (problem in found)


def test_the_store_and_the_wrapper_support_one_range():
    assert compat.SUPPORTED == store_compat.SUPPORTED


def test_a_plain_agent_tells_its_rendezvous_store(tmp_path):
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                           timeout=timedelta(seconds=60))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(OTHER_VERSION)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               PET_RDZV_ENDPOINT=f"127.0.0.1:{master.port}")
    # torchrun itself is asked only for its version: the notice goes out before it starts.
    proc = subprocess.run([sys.executable, "-m", "elasticjob_warm.torchrun", "--version"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "running plain torchrun" in proc.stderr
    master.wait([notice.PLAIN_KEY], timedelta(seconds=60))
    assert master.get(notice.WHY_KEY).decode().startswith("torch 2.99.0 is outside")


@pytest.mark.parametrize("argv, environ, found", [
    (["--rdzv-endpoint=10.0.0.1:29400", "t.py"], {}, "10.0.0.1:29400"),
    (["--rdzv_endpoint", "10.0.0.2:1", "t.py"], {"PET_RDZV_ENDPOINT": "x:1"}, "10.0.0.2:1"),
    (["t.py"], {"PET_RDZV_ENDPOINT": "10.0.0.3:29400"}, "10.0.0.3:29400"),
    (["--standalone", "t.py"], {"PET_RDZV_ENDPOINT": "10.0.0.3:29400"}, None),
])
def test_the_notice_goes_to_the_agents_endpoint(argv, environ, found):
    assert notice.endpoint(argv, environ) == found
