"""Too little memory for two copies of the state: every save goes straight to the volume, said once
(elasticjob_ckpt). A pod's /dev/shm is 64 MiB unless a memory emptyDir is mounted there; here a 1 MiB tmpfs
in a mount namespace of the child's own, and, where namespaces are off, a file size limit (the same refusal
from fallocate, EFBIG instead of ENOSPC)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import resource, signal, sys
import torch
from elasticjob_ckpt import Checkpointer
volume, memory, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
if limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
ckpt = Checkpointer(volume, memory_dir=memory, name="rank0")
for step in (1, 2):
    ckpt.save({"w": torch.full((100_000,), float(step))}, step)  # 400 KB: two slots need 2 x 2 MiB
    print(f"saved {step}", file=sys.stderr, flush=True)
loaded = Checkpointer(volume, memory_dir=memory, name="rank0").load()
assert (loaded.step, loaded.source) == (2, "volume"), loaded
assert torch.equal(loaded.state["w"], torch.full((100_000,), 2.0))
"""


def small_tmpfs(memory: Path, size: str = "1m") -> list[str]:
    """The child's command prefix: a tmpfs of `size` on `memory`, seen by it alone."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    probe = subprocess.run(["unshare", *user, "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespaces here: {probe.stderr.decode().strip()}")
    return ["unshare", *user, "--mount", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "{memory}" && exec "$@"', "sh"]


@pytest.mark.parametrize("limit", ["tmpfs", "tmpfs for one copy", "file size"])
def test_too_little_memory_falls_back_to_the_volume_once_logged(tmp_path, limit):
    """"tmpfs for one copy": the save allocates only the slot it writes (the other behind), yet checks that
    both fit: a state that fits once would fail at the second save."""
    volume, memory = tmp_path / "volume", tmp_path / "memory"
    memory.mkdir()
    prefix = small_tmpfs(memory, "3m" if limit == "tmpfs for one copy" else "1m") if limit != "file size" else []
    done = subprocess.run([*prefix, sys.executable, "-c", SCRIPT, str(volume), str(memory / "ckpt"),
                           "0" if limit != "file size" else str(1 << 20)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("cannot hold 2 x") == 1, done.stderr
    assert done.stderr.index("cannot hold 2 x") < done.stderr.index("saved 1"), "said only at the second save"
    assert sorted(path.name for path in volume.iterdir()) == [
        "rank0-step-000000000001.ejckpt", "rank0-step-000000000002.ejckpt"]
    assert not list(memory.rglob("slot-*")), "the memory copies were not given back"
