"""The `make compat` scenarios that only make sense per torch version: tests/compat/run.py runs them in each
version's own environment, with COMPAT_EXPECT=on inside the supported range and off outside it. Not named
test_*, so that `make test` does not collect them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from store_agents_support import Cluster, now
from test_store_agents import ADDRS, clusters, diagnosed  # noqa: F401 - clusters is a fixture

from elasticjob_store import compat as store_compat
from elasticjob_warm import compat as warm_compat

EXPECT_ON = os.environ.get("COMPAT_EXPECT", "on") == "on"
only_on = pytest.mark.skipif(not EXPECT_ON, reason="outside the supported range: turned off")
only_off = pytest.mark.skipif(EXPECT_ON, reason="inside the supported range")

# Each start of the worker reports how it began, then joins a one-process gloo group and all_reduces; the first
# start fails, so torchrun restarts it.
WORKER = textwrap.dedent("""
    import json, os, sys
    preloaded = "torch.distributed" in sys.modules
    import torch, torch.distributed as dist
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    t = torch.ones(4); dist.all_reduce(t)
    json.dump({"parent": os.getppid(), "preloaded": preloaded, "sum": float(t.sum())},
              open(f"{sys.argv[1]}-{restart}", "w"))
    sys.exit(3 if restart == 0 else 0)
""")


def test_the_store_check_agrees_with_the_range():
    verdict = store_compat.probe()
    print(f"\nstore: {verdict.why}")
    assert verdict.nudges is EXPECT_ON, verdict.why


def test_the_wrapper_check_agrees_with_the_range():
    problem = warm_compat.version_problem(warm_compat.torch_version())
    assert (problem is None) is EXPECT_ON, problem


def test_a_failed_worker_restarts_from_the_warm_server(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"),
               ELASTICJOB_WARM_PRELOAD="torch,torch.distributed")
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--standalone",
                                 "--max-restarts=1", "--monitor-interval=0.1", "--nproc-per-node=1", str(script),
                                 str(tmp_path / "r")], env=env, stdout=log, stderr=log)
        proc.wait(timeout=180)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 0, text[-3000:]
    starts = [json.load(open(tmp_path / f"r-{i}")) for i in range(2)]
    assert all(s["sum"] == 4.0 for s in starts)
    if EXPECT_ON:
        assert all(s["preloaded"] and s["parent"] != proc.pid for s in starts), starts
        assert "rendezvous polled every 0.1 s" in text
    else:
        assert "running plain torchrun" in text
        assert all(not s["preloaded"] and s["parent"] == proc.pid for s in starts), starts


@only_off
def test_outside_the_range_the_store_refuses_nudges_and_torch_recovers_alone(clusters):  # noqa: F811
    cluster: Cluster = clusters(2, 3)
    with diagnosed(cluster):
        cluster.start_store()
        state = cluster.store.state()
        assert state["torch"]["nudges"] is False and state["round"] is None, state
        answer = cluster.store.api("POST", "/v1/remove", {"addr": ADDRS[0], "heartbeatBefore": 1.0})
        assert "nudges are off" in answer["refused"]
        for addr in ADDRS:
            cluster.start_agent(addr)
        cluster.wait_for_world(3, timeout=150)
        killed_at = now()
        cluster.agents[-1].kill()
        recovered = cluster.wait_for_world(2, after=killed_at, timeout=120)["time"] - killed_at
        print(f"\nkilled node, torch alone: first step at world size 2 after {recovered:.1f} s")
