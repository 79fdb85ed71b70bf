"""The kit as the init container installs it, and its launcher run as a worker container would run it.

The image's Python is played by a fake interpreter (a shell script that prints what it was asked to run), so
that each case takes milliseconds; one case runs the real torchrun through the launcher. The launcher runs under
the static busybox the kit carries when this machine has one (the operator image's path), else under /bin/sh.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elasticjob_kit import install

BUSYBOX = next((Path(p) for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).is_file()), None)
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -c ]; then exit "${FAKE_USABLE:-0}"; fi
echo "ran: $0 $*"
echo "pythonpath: ${PYTHONPATH:-}"
"""
FAKE_TORCHRUN = "#!{python}\n"


@pytest.fixture
def kit(tmp_path) -> Path:
    dest = tmp_path / "kit"
    install.install(dest, BUSYBOX)
    return dest


@pytest.fixture
def image(tmp_path) -> Path:
    """A directory standing for the image's PATH: python3 and a torchrun whose first line names it."""
    bin_ = tmp_path / "image-bin"
    bin_.mkdir()
    python = bin_ / "python3"
    python.write_text(FAKE_PYTHON)
    (bin_ / "torchrun").write_text(FAKE_TORCHRUN.format(python=python))
    for path in bin_.iterdir():
        path.chmod(0o755)
    return bin_


def run(argv: list[str], path: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env={"PATH": path, **env}, capture_output=True, text=True, timeout=10)


def test_the_installed_kit_is_readable_and_runnable_by_anyone(kit):
    assert (kit / "lib" / "elasticjob_warm" / "torchrun.py").stat().st_mode & 0o777 == 0o644
    assert (kit / "lib" / "elasticjob_store" / "__main__.py").is_file()
    assert (kit / "bin" / "launch").stat().st_mode & 0o777 == 0o755
    assert os.readlink(kit / "path" / "torchrun") == "../bin/launch"
    assert not list(kit.rglob("__pycache__"))
    first = (kit / "bin" / "launch").read_text().splitlines()[0]
    assert first == (f"#!{kit}/bin/busybox sh" if BUSYBOX else "#!/bin/sh")


def test_torchrun_runs_warm_with_the_interpreter_its_first_line_names(kit, image):
    got = run([str(kit / "bin/launch"), "torchrun", "--nnodes=1:2", "t.py"], f"{image}:/usr/bin:/bin",
              PYTHONPATH="/user/lib")
    assert got.stdout.splitlines() == [f"ran: {image}/python3 -m elasticjob_warm.torchrun --nnodes=1:2 t.py",
                                       f"pythonpath: {kit}/lib:/user/lib"], got.stderr


def test_an_image_whose_python_cannot_import_torch_runs_torchrun_as_written(kit, image):
    got = run([str(kit / "bin/launch"), "torchrun", "t.py"], f"{image}:/usr/bin:/bin", FAKE_USABLE="1")
    # The image's torchrun itself: the kernel runs it with the interpreter its first line names.
    assert got.stdout.splitlines()[0] == f"ran: {image}/python3 {image}/torchrun t.py"
    assert "no Python 3.9+ with torch found" in got.stderr


def test_a_shell_command_finds_the_kits_torchrun_first_and_it_runs_the_images(kit, image):
    got = run(["/bin/sh", "-c", "torchrun --standalone t.py"], f"{kit}/path:{image}:/usr/bin:/bin")
    assert got.stdout.splitlines()[0] == f"ran: {image}/python3 -m elasticjob_warm.torchrun --standalone t.py"
    assert f"{kit}/path" not in got.stdout  # nothing recurses into the kit again


def test_a_shell_command_without_a_usable_python_runs_the_images_torchrun_not_the_kits_again(kit, image):
    got = run(["/bin/sh", "-c", "torchrun t.py"], f"{kit}/path:{image}:/usr/bin:/bin", FAKE_USABLE="1")
    assert got.stdout.splitlines()[0] == f"ran: {image}/python3 {image}/torchrun t.py", got.stderr[-500:]


def test_the_users_python_module_form_keeps_the_users_python(kit, image):
    got = run([str(kit / "bin/launch"), f"{image}/python3", "-m", "torch.distributed.run", "t.py"], "/usr/bin:/bin")
    assert got.stdout.splitlines()[0] == f"ran: {image}/python3 -m elasticjob_warm.torchrun t.py"


def test_the_store_runs_with_the_first_usable_python(kit, image):
    (image / "torchrun").unlink()  # a store needs no torchrun: python3 on PATH serves
    got = run([str(kit / "bin/launch"), "store"], f"{image}:/usr/bin:/bin")
    assert got.stdout.splitlines() == [f"ran: {image}/python3 -m elasticjob_store", f"pythonpath: {kit}/lib"]


def test_anything_else_runs_exactly_as_written(kit):
    got = run([str(kit / "bin/launch"), "/bin/echo", "a b", "c"], "/usr/bin:/bin")
    assert got.stdout == "a b c\n"


@pytest.mark.skipif(BUSYBOX is None, reason="no static busybox on this machine (apt-get install busybox-static)")
def test_the_launcher_needs_no_shell_in_the_image(kit, tmp_path):
    """Under busybox the launcher runs in a root without /bin/sh: checked by what it execs, not by a chroot."""
    text = (kit / "bin" / "launch").read_text()
    assert text.startswith(f"#!{kit}/bin/busybox sh\n")
    got = run([str(kit / "bin/launch"), "/bin/echo", "ok"], "/nonexistent")
    assert got.stdout == "ok\n"


REPORT = textwrap.dedent("""
    import json, os, sys
    json.dump({"warm_socket": os.environ.get("ELASTICJOB_WARM_SOCKET"), "path": sys.path}, open(sys.argv[1], "w"))
""")


def test_real_torchrun_through_the_launcher_starts_its_workers_warm(kit, tmp_path):
    """Seconds: a real agent imports torch. The worker sees the warm server's socket, which only
    elasticjob_warm.torchrun hands out, and the kit's copy of our modules first on its path."""
    script = tmp_path / "job.py"
    script.write_text(REPORT)
    venv_bin = str(Path(sys.executable).parent)
    assert shutil.which("torchrun", path=venv_bin), "torchrun beside this interpreter"
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.run([str(kit / "bin/launch"), "torchrun", "--standalone", "--nproc-per-node=1",
                               str(script), str(tmp_path / "report")], stdout=log, stderr=log, timeout=120,
                              env={"PATH": f"{venv_bin}:/usr/bin:/bin", "ELASTICJOB_WARM_PRELOAD": "decimal"})
    assert proc.returncode == 0, (tmp_path / "log").read_text()[-3000:]
    report = json.loads((tmp_path / "report").read_text())
    assert report["warm_socket"], "the worker was not started by elasticjob_warm.torchrun"
    assert str(kit / "lib") in report["path"]


@pytest.mark.parametrize("package", ["elasticjob_store", "elasticjob_warm", "elasticjob_kit", "elasticjob_ckpt"])
def test_what_runs_on_the_users_python_parses_as_python_3_9(package):
    """The kit runs our modules with the image's interpreter; the launcher refuses one older than 3.9."""
    import ast
    import importlib.util

    root = Path(next(iter(importlib.util.find_spec(package).submodule_search_locations)))
    for path in root.glob("*.py"):
        source = path.read_text()
        ast.parse(source, str(path), feature_version=(3, 9))
        if "|" in source and ("->" in source or ": " in source):  # annotations with X | Y need the future import
            assert "from __future__ import annotations" in source, path
