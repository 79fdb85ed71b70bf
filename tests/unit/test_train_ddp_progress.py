"""examples/train_ddp.py reports its steps and checkpoints through elasticjob_progress, and runs without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

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
