"""examples/train_ddp.py reports its steps and checkpoints through elasticjob_progress, and runs without it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from elasticjob_progress.report import KEY
from elasticjob_store.control import Control
from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_ddp.py"


def test_the_example_reports_to_the_store_named_by_its_pod(tmp_path):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=10))
    env = {**os.environ, "PET_RDZV_ENDPOINT": f"127.0.0.1:{store.port}", "POD_NAME": "train-worker-0"}
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "1", str(SCRIPT), "--steps", "6", "--step-seconds", "0.3",
                           "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(store.get("elasticjob.progress"))
    assert (report["pod"], report["step"], report["firstStep"]) == ("train-worker-0", 6, 1)
    assert report["loaded"]["step"] == 0 and report["saved"]["step"] == 6


def test_without_the_package_the_example_falls_back_to_a_no_op(tmp_path):
    blocker = tmp_path / "sitecustomize.py"  # an import of elasticjob_progress fails, as in an image without it
    blocker.write_text("import sys\nsys.modules['elasticjob_progress'] = None\n")
    code = (f"import runpy; m = runpy.run_path({str(SCRIPT)!r}, run_name='example'); p = m['make_progress']();"
            "p.loading(); p.loaded(0); p.step(1); p.saved(1); print(type(p).__name__)")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "NoProgress"


def test_a_planned_stop_saves_the_agreed_step_on_every_rank_and_the_next_run_resumes_after_it(tmp_path):
    """Two ranks under torchrun; the store's Control asks for a stop as the operator would; both ranks stop at
    its step, rank 0 saves it and reports the stop, and the processes hold until ended (SIGTERM, as a pod's
    deletion or a group restart does). The next run's first step is the one after it: none is lost."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=10))
    env = {**os.environ, "PET_RDZV_ENDPOINT": f"127.0.0.1:{store.port}", "POD_NAME": "train-worker-0",
           "ELASTICJOB_CKPT_MEMORY_DIR": str(tmp_path / "shm")}  # the pod's memory (elasticjob_ckpt)
    torchrun = Path(sys.executable).parent / "torchrun"

    def run(steps: int, memory: str = "shm") -> subprocess.Popen:
        return subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "2", str(SCRIPT), "--steps",
                                 str(steps), "--step-seconds", "0.05", "--checkpoint-every", "1000",
                                 "--checkpoint-dir", str(tmp_path / "ckpt")],
                                env={**env, "ELASTICJOB_CKPT_MEMORY_DIR": str(tmp_path / memory)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def progress() -> list[dict]:
        return [json.loads(line) for line in (tmp_path / "ckpt" / "progress.jsonl").read_text().splitlines()]

    def report() -> dict | None:
        return json.loads(store.get(KEY)) if store.check([KEY]) else None

    first = run(100000)
    try:
        wait_for(report, 120, "the example listening and stepping",
                 until=lambda r: r is not None and r["listens"] and (r["step"] or 0) >= 5 and r["stepSeconds"])
        control = Control(store, "run", 1, 1, log=lambda _: None)
        control.read_progress()
        agreed = control.stop(time.time(), 2.0).step
        assert agreed is not None
        stopped = wait_for(report, 60, "the stop reported", until=lambda r: r is not None and r["stopped"])
        assert stopped["stopped"]["step"] == agreed and first.poll() is None  # held, not exited
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    events = [json.loads(line) for line in (tmp_path / "ckpt" / "events.jsonl").read_text().splitlines()]
    assert sorted((e["event"], e["rank"], e["step"]) for e in events) == [
        ("checkpoint-on-stop", 0, agreed), ("checkpoint-on-stop", 1, agreed)]
    steps = progress()
    assert max(s["step"] for s in steps) == agreed  # no rank stepped past it
    # Restarted on the same pod: the checkpoint comes from the pod's memory (elasticjob_ckpt).
    second = run(agreed + 2)
    assert second.wait(timeout=120) == 0, second.stderr.read()[-3000:] if second.stderr else ""
    resumed = progress()[len(steps):]
    assert min(s["step"] for s in resumed) == agreed + 1 and {s["resumed_from"] for s in resumed} == {agreed}
    assert {s["loaded_from"] for s in resumed} == {"memory"}
    # On a new pod (its memory empty): from the volume, which the stop's save reached before the pod could go.
    third = run(agreed + 4, memory="new-pod-shm")
    assert third.wait(timeout=120) == 0, third.stderr.read()[-3000:] if third.stderr else ""
    replaced = progress()[len(steps) + len(resumed):]
    assert {(s["resumed_from"], s["loaded_from"]) for s in replaced} == {(agreed + 2, "volume")}


def test_without_the_checkpoint_package_the_example_saves_with_torch(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['elasticjob_ckpt'] = None\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    torchrun = Path(sys.executable).parent / "torchrun"
    ckpt = tmp_path / "ckpt"
    for steps in (4, 6):
        done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "1", str(SCRIPT), "--steps",
                               str(steps), "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt)],
                              env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (ckpt / "progress.jsonl").read_text().splitlines()]
    assert [(r["step"], r["resumed_from"], r["loaded_from"]) for r in records] == [
        (1, 0, None), (2, 0, None), (3, 0, None), (4, 0, None), (5, 4, "file"), (6, 4, "file")]
    assert (ckpt / "checkpoint.pt").exists() and not list(ckpt.glob("*.ejckpt"))


def test_a_rank_stuck_in_a_collective_leaves_on_sigterm_without_waiting_out_the_grace(tmp_path):
    """Rank 0 hangs inside a step, so rank 1 waits in the step's collective for a peer that never comes (a
    partition, a lost node: no reset reaches it). The operator then restarts the group, and its agent SIGTERMs
    the workers: the stuck ranks leave at once, not after --sigterm-grace (60 s here; the default 2 s was most
    of a partition's restart)."""
    import psutil

    torchrun = Path(sys.executable).parent / "torchrun"
    agent = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "2", str(SCRIPT), "--steps", "1000",
                              "--step-seconds", "0.05", "--hang-at-step", "8", "--sigterm-grace", "60",
                              "--checkpoint-dir", str(tmp_path)],
                             env={**os.environ, "LOGLEVEL": "WARNING"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (tmp_path / "hung-at-step-8").exists(), 120, "rank 0 hanging in step 8")
        workers = wait_for(lambda: psutil.Process(agent.pid).children(), 30, "the workers", until=lambda c: len(c) == 2)
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        gone, alive = psutil.wait_procs(workers, timeout=30)  # well inside the 60 s grace
        assert not alive and len(gone) == 2
    finally:
        agent.kill()
        output = agent.communicate(timeout=60)[0]
    assert output.count("(stuck in a collective); leaving") == 2, output[-3000:]
