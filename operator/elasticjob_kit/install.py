"""`python -m elasticjob_kit DIR`: copy the kit into DIR (the job pod's emptyDir), as the init container does."""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

# elasticjob_progress (the training script's progress API) and elasticjob_ckpt (checkpoints in memory): importable by
# the workers the kit's torchrun starts.
PACKAGES = ("elasticjob_store", "elasticjob_warm", "elasticjob_progress", "elasticjob_ckpt")
# Where the operator's image keeps a static busybox (images/operator.Dockerfile); any other busybox found on
# PATH is used only when it is static, which install() cannot tell: the image's own is trusted, PATH's is not.
BUSYBOX = Path("/opt/elasticjob/bin/busybox")
LAUNCH = "launch"


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"elasticjob_kit: package {name} is not installed here")
    return Path(next(iter(spec.submodule_search_locations)))


def header(dest: Path, busybox: Path | None) -> str:
    interpreter = f"{dest / 'bin' / 'busybox'} sh" if busybox else "/bin/sh"
    return f"#!{interpreter}\nkit={shlex.quote(str(dest))}\n"


def install(dest: Path, busybox: Path | None = None) -> None:
    """Readable and runnable by any user: the workers need not run as the init container's user."""
    for name in PACKAGES:
        shutil.copytree(package_dir(name), dest / "lib" / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "path").mkdir(parents=True, exist_ok=True)
    if busybox is not None:
        shutil.copyfile(busybox, dest / "bin" / "busybox")
    body = importlib.resources.files("elasticjob_kit").joinpath("launch.sh").read_text()
    launcher = dest / "bin" / LAUNCH
    launcher.write_text(header(dest, busybox) + body)
    torchrun = dest / "path" / "torchrun"
    torchrun.unlink(missing_ok=True)
    torchrun.symlink_to(Path("..") / "bin" / LAUNCH)
    for root, _dirs, files in os.walk(dest):
        if Path(root) != dest:  # the emptyDir itself is the kubelet's (0777), not ours to change
            os.chmod(root, 0o755)
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                os.chmod(path, 0o755 if path.parent.name == "bin" else 0o644)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m elasticjob_kit DIR", file=sys.stderr)
        return 2
    busybox = BUSYBOX if BUSYBOX.is_file() else None
    if busybox is None:
        print(f"elasticjob_kit: no {BUSYBOX}; the launcher needs /bin/sh in the job's image", file=sys.stderr)
    install(Path(argv[0]), busybox)
    print(f"elasticjob_kit: installed into {argv[0]}")
    return 0
