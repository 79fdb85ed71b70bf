"""The images a real node runs, put into its containerd: no registry can be reached here.

The cluster's own parts (the pause sandbox, CoreDNS) are one static Go binary each, made into an image `FROM
scratch` with buildah; the project's images come from imagebuild (images/*.Dockerfile). Each node imports every
tarball with `ctr images import`, once per tarball (a marker names the tarballs a node has).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from localcluster.imagebuild import plan as imageplan
from localcluster.realnodes.plan import RealNode

Log = Callable[[str], None]


def binary_image(cache: Path, binary: Path, ref: str, log: Log) -> Path:
    """A docker-archive tarball of `ref`: the binary at /<name>, its entrypoint; cached by the binary's digest."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    name = ref.rsplit("/", 1)[-1].replace(":", "-")
    tarball = cache / f"{name}-{digest}.tar"
    if tarball.exists():
        return tarball
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    storage = cache / f".storage-{time.time_ns()}"
    partial = tarball.with_suffix(".partial")
    try:
        def buildah(*argv: str) -> str:
            result = subprocess.run(imageplan.buildah(storage, *argv), capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"buildah {argv[0]} for {ref} failed: {result.stderr.strip()[-500:]}")
            return result.stdout.strip()

        container = buildah("from", "scratch")
        buildah("copy", container, str(binary), f"/{binary.name}")
        buildah("config", "--entrypoint", f'["/{binary.name}"]', container)
        buildah("commit", "--quiet", "--rm", container, f"localhost/{ref}")
        buildah("push", "--quiet", f"localhost/{ref}", f"docker-archive:{partial}:{ref}")
        partial.rename(tarball)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(storage, ignore_errors=True)
    log(f"  image {ref} from {binary.name} ({time.monotonic() - started:.1f}s)")
    return tarball


def imported(node: RealNode) -> set[str]:
    marker = node.path("imported")
    return set(marker.read_text().split()) if marker.exists() else set()


def import_all(node: RealNode, tarballs: list[Path], log: Log) -> None:
    """Imports what the node's containerd does not have yet (its content store survives restarts)."""
    have = imported(node)
    for tarball in tarballs:
        if tarball.name in have:
            continue
        started = time.monotonic()
        result = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "images", "import",
                                 str(tarball)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{node.name}: ctr images import {tarball.name} failed: {result.stderr.strip()}")
        have.add(tarball.name)
        node.path("imported").write_text("\n".join(sorted(have)) + "\n")
        log(f"  {node.name}: imported {tarball.name} ({time.monotonic() - started:.1f}s)")
