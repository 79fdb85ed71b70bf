"""Runs the plan: bootstrap (or reuse) the base root filesystem and the wheelhouse, then build, smoke-check and
export each image whose inputs changed. Every result is written under a temporary name and renamed into place,
and buildah's storage is scratch that is removed at the end, so a failure leaves nothing half-built.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from localcluster.imagebuild import plan

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """One line saying which step failed; the step's own output has already gone to stderr."""


@dataclass(frozen=True)
class Inputs:
    root: Path  # the repo: the build context
    cache: Path
    torch_wheel: Path
    log: Log


def run(argv: list[str], what: str, capture: bool = False) -> str:
    """Runs argv at low priority (the machine is shared); its output goes to stderr unless captured."""
    result = subprocess.run(["nice", "-n", "10", *argv], stdout=subprocess.PIPE if capture else sys.stderr,
                            text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{what} failed (exit {result.returncode})")
    return result.stdout or ""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _timed(inputs: Inputs, what: str, started: float) -> None:
    inputs.log(f"{what} in {time.monotonic() - started:.1f}s")


def ensure_base(inputs: Inputs) -> tuple[str, Path]:
    """The base root filesystem's tarball, bootstrapped once per mmdebstrap command line."""
    key = plan.base_key()
    tarball = inputs.cache / f"base-{plan.SUITE}-{key[:16]}.tar"
    if not tarball.exists():
        inputs.log(f"bootstrapping the {plan.SUITE} base with mmdebstrap ({', '.join(plan.BASE_PACKAGES)})")
        # mmdebstrap picks its output format from the name, so the partial one keeps the .tar ending.
        started, partial = time.monotonic(), tarball.with_name(".partial-" + tarball.name)
        try:
            run(plan.mmdebstrap_argv(partial), "mmdebstrap")
            partial.rename(tarball)
        finally:
            partial.unlink(missing_ok=True)
        _timed(inputs, "base bootstrapped", started)
    return key, tarball


def ensure_wheelhouse(inputs: Inputs) -> Path:
    """Every wheel the Dockerfiles' pip needs except torch, downloaded once per requirement list by this
    interpreter's pip (the same CPython minor version as the base's)."""
    try:
        with zipfile.ZipFile(inputs.torch_wheel) as wheel:
            metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            torch_requires = plan.requires_dist(wheel.read(metadata).decode())
    except (zipfile.BadZipFile, StopIteration) as error:
        raise BuildError(f"{inputs.torch_wheel} is not a wheel ({error or 'no METADATA'})") from error
    requirements = [*plan.project_requirements((inputs.root / "pyproject.toml").read_text()), *torch_requires]
    key = plan.cache_key([("requirement", r.encode()) for r in requirements])
    wheelhouse = inputs.cache / f"wheelhouse-{key[:16]}"
    if not wheelhouse.exists():
        inputs.log(f"downloading {len(requirements)} requirements and their dependencies into {wheelhouse}")
        partial = wheelhouse.with_name(wheelhouse.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(partial),
                 *requirements], "pip download of the wheelhouse")
            partial.rename(wheelhouse)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return wheelhouse


def remove_storage(storage: Path) -> None:
    """buildah's scratch storage gone, mounts first: an overlay container's root filesystem stays mounted when a
    step is killed before it unmounts (an interrupted build), and removing through that mount would reach into
    the layers under it."""
    prefix = str(storage) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    shutil.rmtree(storage, ignore_errors=True)


@contextmanager
def scratch_storage(inputs: Inputs) -> Iterator[Path]:
    storage = inputs.cache / f".storage-{time.time_ns()}"
    try:
        yield storage
    finally:
        remove_storage(storage)


def import_base(storage: Path, key: str, tarball: Path) -> str:
    """The base tarball as a local image (what `docker import` would make), named by its key."""
    ref = f"{plan.BASE_NAME}:{key[:16]}"
    container = run(plan.buildah(storage, "from", "scratch"), "buildah from scratch", capture=True).strip()
    run(plan.buildah(storage, "add", "--quiet", container, str(tarball), "/"), "buildah add of the base")
    run(plan.buildah(storage, "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                     "--env", "LANG=C.UTF-8", "--cmd", "python3", container), "buildah config of the base")
    run(plan.buildah(storage, "commit", "--quiet", "--rm", container, ref), "buildah commit of the base")
    return ref


def smoke(storage: Path, spec: plan.ImageSpec, log: Log) -> None:
    """Runs the image's checks in its own root filesystem, as the user its config names, without a runtime."""
    what = f"smoke check of {spec.ref}"
    container = run(plan.buildah(storage, "from", "--quiet", "--pull=never", f"localhost/{spec.ref}"), what,
                    capture=True).strip()
    try:
        exec_ = ["run", "--isolation", "chroot", container, "--"]
        uid = run(plan.buildah(storage, *exec_, "id", "-u"), f"{what}: id -u", capture=True).strip()
        if uid == "0" and spec.non_root:
            raise BuildError(f"{what}: the image runs as root; its Dockerfile must name a non-root USER")
        for command in spec.smoke:
            out = run(plan.buildah(storage, *exec_, *command), f"{what}: {' '.join(command)}", capture=True)
            log(f"  {spec.ref} as uid {uid}: `{' '.join(command)[:60]}` ok ({(out.splitlines() or [''])[0][:60]})")
    finally:
        subprocess.run(plan.buildah(storage, "rm", container), capture_output=True, check=False)


def build_image(inputs: Inputs, spec: plan.ImageSpec, tarball: Path, storage: Path, base_ref: str,
                wheelhouse: Path) -> None:
    started = time.monotonic()
    pip_conf = storage / "pip.conf"
    pip_conf.parent.mkdir(parents=True, exist_ok=True)
    pip_conf.write_text(plan.pip_conf())
    inputs.log(f"building {spec.ref} from {spec.dockerfile} ({spec.base_arg}={base_ref})")
    run(plan.bud_argv(storage, spec, base_ref, inputs.root, wheelhouse, inputs.torch_wheel.parent, pip_conf),
        f"buildah bud of {spec.dockerfile}")
    _timed(inputs, f"{spec.ref} built", started)
    smoke(storage, spec, inputs.log)
    partial = tarball.with_suffix(".partial")
    try:
        run(plan.push_argv(storage, spec, partial), f"export of {spec.ref}")
        partial.rename(tarball)
    finally:
        partial.unlink(missing_ok=True)
    for old in inputs.cache.glob(f"{spec.name}-{spec.tag}-*.tar"):
        if old != tarball:
            old.unlink()
    _timed(inputs, f"{spec.ref} -> {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)", started)


def build_all(inputs: Inputs, specs: tuple[plan.ImageSpec, ...]) -> list[Path]:
    """The tarballs of specs, built where their key has no tarball yet."""
    inputs.cache.mkdir(parents=True, exist_ok=True)
    base_key, base_tarball = ensure_base(inputs)
    wheelhouse = ensure_wheelhouse(inputs)
    torch_digest = sha256_file(inputs.torch_wheel)
    wheels = [p.name for p in wheelhouse.iterdir()]
    wanted = [(spec, inputs.cache / plan.tarball_name(
        spec, plan.image_key(spec, inputs.root, base_key, wheels, torch_digest))) for spec in specs]
    for spec, tarball in wanted:
        if tarball.exists():
            inputs.log(f"{spec.ref}: cached, nothing changed ({tarball})")
    missing = [(spec, tarball) for spec, tarball in wanted if not tarball.exists()]
    if missing:
        with scratch_storage(inputs) as storage:
            base_ref = import_base(storage, base_key, base_tarball)
            for spec, tarball in missing:  # one at a time: the machine is shared
                build_image(inputs, spec, tarball, storage, base_ref, wheelhouse)
    return [tarball for _, tarball in wanted]
