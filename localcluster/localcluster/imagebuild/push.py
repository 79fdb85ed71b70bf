"""Pushes the images imagebuild made (docker-archive tarballs) to a registry with buildah: each tarball is
pulled into a scratch storage and pushed from there under its reference in the registry, with the registry's
credentials (an auth file) and CA (a cert dir). Returns each image's manifest digest, which pins it.

A registry's data folder may hold a marker (`pushed.json`: reference -> tarball and digest): a tarball pushed
there under the same reference is not pushed again (the local registry's blobs outlive the cluster).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localcluster import registry
from localcluster.imagebuild import build, plan
from localcluster.layout import Layout

Log = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    registry: str  # where to push: host[:port]/path, e.g. 127.0.0.1:5001/elasticjob
    auth_file: Path | None = None  # None: buildah's own (REGISTRY_AUTH_FILE, or $XDG_RUNTIME_DIR/containers/auth.json)
    cert_dir: Path | None = None  # None: the system's CAs
    marker: Path | None = None
    # The same repository as pulls name it, where they go through another address (the local registry's read-only
    # side, 10.244.0.1:5000/elasticjob); None: `registry`.
    served_as: str | None = None

    @property
    def pulled(self) -> str:
        return self.served_as or self.registry


def local_target(layout: Layout) -> Target:
    """The local cluster's registry: pushed through its push side, named as pods pull them (its read-only side)."""
    where = registry.files(layout)
    return Target(registry.PUSH_REPOSITORY, where.auth, where.certs, registry.DATA / "pushed.json",
                  served_as=registry.REPOSITORY)


def reference(registry: str, spec: plan.ImageSpec) -> str:
    return f"{registry}/{spec.name}:{spec.tag}"


def push_argv(storage: Path, image_id: str, ref: str, target: Target, digest_file: Path) -> list[str]:
    extra = [*(["--authfile", str(target.auth_file)] if target.auth_file else []),
             *(["--cert-dir", str(target.cert_dir)] if target.cert_dir else [])]
    return plan.buildah(storage, "push", "--quiet", "--digestfile", str(digest_file), *extra, image_id,
                        f"docker://{ref}")


def _marker(target: Target) -> dict[str, dict[str, str]]:
    if target.marker is None or not target.marker.exists():
        return {}
    return json.loads(target.marker.read_text())


def push_all(images: list[tuple[plan.ImageSpec, Path]], target: Target, scratch: Path, log: Log) -> dict[str, str]:
    """(spec, tarball) pairs -> {reference as pulled: digest}, every one of them in the registry on return."""
    pushed, digests = _marker(target), {}
    storage = scratch / f".push-storage-{time.time_ns()}"
    try:
        for spec, tarball in images:
            ref, named = reference(target.registry, spec), reference(target.pulled, spec)
            if pushed.get(named, {}).get("tarball") == tarball.name:
                digests[named] = pushed[named]["digest"]
                continue
            started = time.monotonic()
            image_id = _run(plan.buildah(storage, "pull", "--quiet", f"docker-archive:{tarball}"), ref).split()[-1]
            digest_file = storage / "digest"
            _run(push_argv(storage, image_id, ref, target, digest_file), ref)
            digests[named] = digest_file.read_text().strip()
            pushed[named] = {"tarball": tarball.name, "digest": digests[named]}
            if target.marker is not None:
                target.marker.write_text(json.dumps(pushed, indent=2) + "\n")
            log(f"  pushed {ref} ({digests[named][:19]}, {time.monotonic() - started:.1f}s)")
    finally:
        build.remove_storage(storage)
    return digests


def _run(argv: list[str], ref: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"buildah {argv[argv.index('--storage-driver') + 2]} for {ref} failed: "
                           f"{result.stderr.strip()[-500:]}")
    return result.stdout.strip()


def spec_of(tarball: Path, specs: tuple[plan.ImageSpec, ...] = plan.IMAGES) -> plan.ImageSpec | None:
    """The image a tarball of imagebuild's holds (its name is `<name>-<tag>-<key>.tar`)."""
    for spec in specs:
        if tarball.name.startswith(f"{spec.name}-{spec.tag}-"):
            return spec
    return None
