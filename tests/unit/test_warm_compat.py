"""`python -m elasticjob_warm.torchrun` on a torch it was not tested on runs plain torchrun, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from torch.distributed import run
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

from elasticjob_store import compat as store_compat
from elasticjob_warm import compat

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
