"""Warm worker starts on a GPU (`make gpu-check`): the warm server forks workers after importing torch, and a
CUDA context made before a fork breaks every child. These run the wrapper as the pod does
(`python -m elasticjob_warm.torchrun`, its default preload) with workers that use CUDA, restarted by torchrun.

Skipped where torch sees no CUDA device, unless GPU_CHECK_ON_CPU=1: then the same scenarios run with gloo on
the CPU, which only checks the scenarios themselves. Not named test_*, so `make test` does not collect them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
ON_GPU = torch.cuda.is_available()
needs_a_device = pytest.mark.skipif(not ON_GPU and os.environ.get("GPU_CHECK_ON_CPU") != "1",
                                    reason="no CUDA device (GPU_CHECK_ON_CPU=1 runs the scenarios on the CPU)")

# Each start reports how it began (was torch already imported, was CUDA already initialized, who forked it), joins
# the group, all_reduces a tensor on the device and reports when; the first start then fails, so torchrun
# restarts the workers.
WORKER = textwrap.dedent("""
    import json, os, sys, time
    preloaded = "torch.distributed" in sys.modules
    import torch, torch.distributed as dist
    cuda_at_start = torch.cuda.is_initialized()
    backend, out = sys.argv[1], sys.argv[2]
    restart, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    device = torch.device("cuda", 0) if backend != "cpu" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if backend in ("cpu", "gloo") else backend,
                            device_id=device if backend == "nccl" else None)
    x = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    report = {"parent": os.getppid(), "preloaded": preloaded, "cuda_at_start": cuda_at_start,
              "sum": float(x[0]), "device": str(x.device), "stepped": time.time()}
    dist.destroy_process_group()
    report["exited"] = time.time()
    json.dump(report, open(f"{out}/start-{restart}-rank-{rank}", "w"))
    sys.exit(3 if restart == 0 else 0)
""")
# As the operator sets it (elasticjob/torchrun.py): each round's workers make their own store. With torch's
# shared store a restarted gloo group can read its predecessor's addresses (plain torchrun too: refused).
AS_IN_THE_POD = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass
class Restarted:
    """One agent whose workers failed once and were restarted: each start's reports, the agent's pid and log."""

    starts: list[list[dict]]
    agent_pid: int
    log: str
    seconds: float  # from the failed start's exit to the restarted workers' first all_reduce

    @property
    def warm(self) -> bool:
        return all(r["preloaded"] and r["parent"] != self.agent_pid for start in self.starts for r in start)


def private_socket(tmp: Path) -> str:
    """The warm server listens only in a folder that no other user can enter (protocol.py)."""
    folder = tmp / "warm"
    folder.mkdir(mode=0o700)
    return str(folder / "server.sock")


def backend_here(wanted: str) -> str:
    return wanted if ON_GPU else "cpu"


def restart_once(tmp: Path, *, backend: str, nproc: int, launcher: str = "elasticjob_warm.torchrun",
                 env: dict[str, str] | None = None) -> Restarted:
    """Runs one standalone agent (as torchrun would) whose workers fail once, and reads what each start saw."""
    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / "worker.py"
    script.write_text(WORKER)
    environ = dict(os.environ, **AS_IN_THE_POD, **(env or {}), ELASTICJOB_WARM_SOCKET=private_socket(tmp))
    with open(tmp / "log", "w") as log:
        agent = subprocess.Popen([sys.executable, "-m", launcher, "--standalone", "--max-restarts=1",
                                  "--monitor-interval=0.1", f"--nproc-per-node={nproc}", str(script), backend,
                                  str(tmp)], env=environ, stdout=log, stderr=log, start_new_session=True)
        try:
            agent.wait(timeout=240)
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
    text = (tmp / "log").read_text()
    assert agent.returncode == 0, text[-4000:]
    starts = [[json.loads((tmp / f"start-{i}-rank-{r}").read_text()) for r in range(nproc)] for i in range(2)]
    seconds = min(r["stepped"] for r in starts[1]) - max(r["exited"] for r in starts[0])
    return Restarted(starts, agent.pid, text, seconds)


def check_start(restarted: Restarted, nproc: int) -> None:
    expected = float(sum(range(1, nproc + 1)))
    for start in restarted.starts:
        assert [r["sum"] for r in start] == [expected] * nproc, start
        assert all(r["device"].startswith("cuda" if ON_GPU else "cpu") for r in start), start
        assert not any(r["cuda_at_start"] for r in start), f"a worker began with CUDA already initialized: {start}"
    assert "CUDA was initialized" not in restarted.log, restarted.log[-3000:]
    assert restarted.warm, f"not forked by the warm server: {restarted.starts}\n{restarted.log[-3000:]}"


@needs_a_device
def test_an_nccl_worker_fails_and_restarts_warm_on_the_gpu(tmp_path):
    restarted = restart_once(tmp_path, backend=backend_here("nccl"), nproc=1)
    check_start(restarted, 1)
    print(f"\nnccl, 1 worker: restarted warm, first all_reduce {restarted.seconds:.2f} s after the failure")


@needs_a_device
def test_two_workers_on_one_gpu_fail_and_restart_warm(tmp_path):
    """NCCL refuses two ranks on one device, so these share the GPU through gloo's CUDA all_reduce."""
    restarted = restart_once(tmp_path, backend=backend_here("gloo"), nproc=2)
    check_start(restarted, 2)
    print(f"\ngloo on CUDA, 2 workers: restarted warm, first all_reduce {restarted.seconds:.2f} s after the failure")


def progress(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@needs_a_device
def test_ddp_training_on_the_gpu_resumes_warm_after_a_killed_worker(tmp_path):
    """examples/train_ddp.py as the pod runs it: DDP (nccl on the GPU), a worker SIGKILLed mid-training,
    torchrun restarts it from the warm server, and training resumes from the checkpoint."""
    ckpt, log = tmp_path / "ckpt", open(tmp_path / "log", "w")
    env = dict(os.environ, **AS_IN_THE_POD, ELASTICJOB_WARM_SOCKET=private_socket(tmp_path))
    agent = subprocess.Popen(
        [sys.executable, "-m", "elasticjob_warm.torchrun", "--standalone", "--max-restarts=1",
         "--monitor-interval=0.1", "--nproc-per-node=1", str(ROOT / "examples" / "train_ddp.py"), "--steps=80",
         "--step-seconds=0.05", "--checkpoint-every=5", f"--checkpoint-dir={ckpt}"],
        env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        first = wait_for(lambda: [p for p in progress(ckpt / "progress.jsonl") if p["step"] >= 12], 180,
                         "the first run at step 12")[0]
        os.kill(first["pid"], signal.SIGKILL)
        assert agent.wait(timeout=180) == 0, (tmp_path / "log").read_text()[-4000:]
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    steps = progress(ckpt / "progress.jsonl")
    second = [p for p in steps if p["restart_count"] == 1]
    assert second and second[0]["resumed_from"] >= 10 and second[-1]["step"] == 80, steps[-3:]
    assert second[0]["pid"] != first["pid"] and second[0]["pid"] != agent.pid
    text = (tmp_path / "log").read_text()
    assert "CUDA was initialized" not in text and "running plain torchrun" not in text, text[-3000:]
    print(f"\nDDP ({'nccl on ' + torch.cuda.get_device_name(0) if ON_GPU else 'gloo on the CPU'}): SIGKILLed at "
          f"step {first['step']}, resumed from {second[0]['resumed_from']}, "
          f"{second[0]['time'] - first['time']:.2f} s from the kill's last step to the next")
