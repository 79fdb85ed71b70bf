"""The pure half of the image builder: what to build, from which inputs, under which cache key, with which
commands. Nothing here runs a process or writes a file, so all of it is table-tested.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from localcluster.images import instructions
from localcluster.version import VERSION

# Bumped when the builder itself changes what it puts into an image, so old tarballs stop matching.
BUILDER_FORMAT = "1"
# The suite the base root filesystem is bootstrapped from, and the CPython tag its python3 has: the torch wheel
# must carry the same tag (bookworm's python3 is 3.11).
SUITE = "bookworm"
PYTHON_TAG = "cp311"
PYTHON_VERSION = (3, 11)
# python:3.11-slim's parts that the Dockerfiles use: `python`, `pip`, and a pip allowed to install into the
# system interpreter (the image is the environment; Debian's externally-managed marker is removed).
BASE_PACKAGES = ("python3", "python3-pip", "python-is-python3")
BASE_NAME = "localhost/elasticjob-base"
# Where the build's RUN steps see the wheels (bind mounts that never reach the image).
WHEELHOUSE_MOUNT = "/run/elasticjob/wheelhouse"
TORCH_MOUNT = "/run/elasticjob/torch-wheels"
PIP_CONF_MOUNT = "/etc/pip.conf"
# overlay, not vfs: vfs copies the whole root filesystem for every container and every commit (the worker's 1.1 GB
# twice more per build: about 45 s of a 130 s worker build, nearly all of it kernel time taken from the Go build
# that runs beside it). The layers hold the same files either way; the real nodes' containerd needs overlay too.
STORAGE_FLAGS = ("--storage-driver", "overlay")


@dataclass(frozen=True)
class ImageSpec:
    name: str
    tag: str
    dockerfile: str
    base_arg: str  # the Dockerfile's ARG naming its base image: the only thing that differs from a real build
    smoke: tuple[tuple[str, ...], ...]  # commands that must exit 0 inside the image, as its own user
    # The worker image keeps its base's root user, as training images commonly do: the example's checkpoints go
    # to a hostPath the kubelet creates root-owned. The store pod sets its own non-root user (builders.py).
    non_root: bool = True

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


# Tagged with the project's one version (the chart's appVersion, version.py): the chart's default image is the
# operator's; the CPU worker's tag says its flavour after it.
IMAGES = (
    ImageSpec("elasticjob-operator", VERSION, "images/operator.Dockerfile", "PYTHON_IMAGE",
              smoke=(("elasticjob", "--help"), ("/opt/elasticjob/bin/busybox", "sh", "-c", "true"),
                     ("python", "-m", "elasticjob_kit", "/tmp/kit"))),
    ImageSpec("elasticjob-worker", f"{VERSION}-cpu", "images/worker-cpu.Dockerfile", "PYTHON_IMAGE",
              smoke=(("python", "-c", "import torch, elasticjob_store, elasticjob_warm; print(torch.__version__)"),
                     ("torchrun", "--help")), non_root=False),
)


def cache_key(parts: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over (name, content) pairs, each length-prefixed so that no two different lists hash alike."""
    digest = hashlib.sha256()
    for name, content in parts:
        for piece in (name.encode(), content):
            digest.update(len(piece).to_bytes(8, "big"))
            digest.update(piece)
    return digest.hexdigest()


def copy_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths the Dockerfile's COPY/ADD instructions read (not those from another stage)."""
    sources: list[str] = []
    for word, arguments in instructions(dockerfile_text):
        if word not in ("COPY", "ADD"):
            continue
        words = arguments.split()
        if any(w.startswith("--from=") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources.extend(p.rstrip("/") or "." for p in paths[:-1])
    return sources


def ignored(relative: Path, patterns: Iterable[str]) -> bool:
    """Whether .dockerignore keeps the path out of the context: a pattern matching the path or a folder above it
    (`**/` matching at any depth; the subset of the syntax that this repo's .dockerignore uses)."""
    prefixes = [Path(*relative.parts[:i]) for i in range(1, len(relative.parts) + 1)]
    for pattern in patterns:
        anywhere = pattern.startswith("**/")
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix.name if anywhere else str(prefix), pattern.removeprefix("**/")):
                return True
    return False


def dockerignore_patterns(text: str) -> list[str]:
    return [line.strip().rstrip("/") for line in text.splitlines() if line.strip() and not line.startswith("#")]


def context_files(root: Path, sources: Iterable[str], ignore: Iterable[str] = ()) -> list[Path]:
    """Every file under the COPY sources that the build context holds, sorted."""
    patterns = list(ignore)
    found: set[Path] = set()
    for source in sources:
        path = root / source
        candidates = path.rglob("*") if path.is_dir() else [path]
        found.update(p for p in candidates if p.is_file() and not ignored(p.relative_to(root), patterns))
    return sorted(found)


def arg_default(dockerfile_text: str, name: str) -> str | None:
    """`ARG NAME=value` -> value (the first one declared), or None."""
    for word, arguments in instructions(dockerfile_text):
        key, sep, value = arguments.partition("=")
        if word == "ARG" and key.strip() == name:
            return value.strip().strip('"') if sep else None
    return None


def final_user(dockerfile_text: str) -> str | None:
    """The USER of the last stage (what the image runs as), or None when it names none (root)."""
    user = None
    for word, arguments in instructions(dockerfile_text):
        if word == "FROM":
            user = None
        elif word == "USER":
            user = arguments.strip()
    return user


def torch_wheel_pattern(version: str) -> str:
    return f"torch-{version}+cpu-{PYTHON_TAG}-{PYTHON_TAG}-*.whl"


def requires_dist(metadata: str) -> list[str]:
    """A wheel's unconditional requirements (Requires-Dist lines without an extra)."""
    found = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = line.split(":", 1)[1].strip()
            if not re.search(r";.*\bextra\s*==", requirement):
                found.append(requirement)
    return found


def project_requirements(pyproject_text: str) -> list[str]:
    """What installing the project needs: its build backend and its runtime dependencies."""
    data = tomllib.loads(pyproject_text)
    return [*data["build-system"]["requires"], *data["project"]["dependencies"]]


def pip_conf() -> str:
    """The build's pip reads only the mounted wheels: the build runs with no index to reach."""
    return f"[global]\nno-index = true\nfind-links =\n    {WHEELHOUSE_MOUNT}\n    {TORCH_MOUNT}\n"


def mmdebstrap_argv(target: Path) -> list[str]:
    # Debian's own image builds do the same clean-up: no package lists or .deb cache in the image.
    return ["mmdebstrap", "--variant=apt", "--format=tar", "--include=" + ",".join(BASE_PACKAGES),
            "--customize-hook=rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED",
            "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*.bin",
            SUITE, str(target)]


def base_key() -> str:
    return cache_key([("format", BUILDER_FORMAT.encode()), ("argv", "\0".join(mmdebstrap_argv(Path("-"))).encode())])


def buildah(storage: Path, *argv: str) -> list[str]:
    return ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"), *STORAGE_FLAGS, *argv]


def bud_argv(storage: Path, spec: ImageSpec, base_ref: str, root: Path, wheelhouse: Path, torch_dir: Path,
             pip_conf_file: Path) -> list[str]:
    return buildah(storage, "bud", "--isolation", "chroot", "--layers=false", "--force-rm", "--pull=never",
                   "-f", str(root / spec.dockerfile), "-t", f"localhost/{spec.ref}",
                   "--build-arg", f"{spec.base_arg}={base_ref}",
                   "--volume", f"{wheelhouse}:{WHEELHOUSE_MOUNT}:ro",
                   "--volume", f"{torch_dir}:{TORCH_MOUNT}:ro",
                   "--volume", f"{pip_conf_file}:{PIP_CONF_MOUNT}:ro",
                   str(root))


def push_argv(storage: Path, spec: ImageSpec, tarball: Path) -> list[str]:
    # The archive names the image as a Docker build would tag it, so `ctr -n k8s.io images import` lists
    # docker.io/library/<name>:<tag>, which is what a pod's `image: <name>:<tag>` resolves to.
    return buildah(storage, "push", "--quiet", f"localhost/{spec.ref}", f"docker-archive:{tarball}:{spec.ref}")


def tarball_name(spec: ImageSpec, key: str) -> str:
    return f"{spec.name}-{spec.tag}-{key[:16]}.tar"


def preflight(euid: int, which: Callable[[str], str | None], torch_dir: Path, torch_wheels: list[Path],
              version: str, python: tuple[int, int]) -> str | None:
    """The first missing prerequisite as one line, or None when the build can start."""
    if python != PYTHON_VERSION:
        # This interpreter's pip downloads the wheelhouse; its wheels must fit the base's python3.
        return (f"python {python[0]}.{python[1]} runs the builder; the wheelhouse needs "
                f"{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}, the base's python3")
    if euid != 0:
        return "not root: buildah with the overlay driver and chroot isolation needs root (run with sudo)"
    for program, package in (("buildah", "buildah"), ("mmdebstrap", "mmdebstrap")):
        if which(program) is None:
            return f"{program} is absent: `apt-get install {package}`"
    if not torch_wheels:
        return f"no torch wheel {torch_wheel_pattern(version)} in {torch_dir}"
    return None


def image_key(spec: ImageSpec, root: Path, base: str, wheels: Iterable[str], torch_digest: str) -> str:
    """Everything that goes into the image: its Dockerfile, the files it copies, the base, the wheels, and the
    build's own arguments."""
    dockerfile = (root / spec.dockerfile).read_text()
    dockerignore = root / ".dockerignore"
    patterns = dockerignore_patterns(dockerignore.read_text()) if dockerignore.exists() else []
    files = context_files(root, copy_sources(dockerfile), patterns)
    return cache_key([("format", BUILDER_FORMAT.encode()), ("ref", spec.ref.encode()),
                      ("dockerfile", dockerfile.encode()), ("base", base.encode()),
                      ("pip.conf", pip_conf().encode()), ("torch", torch_digest.encode()),
                      ("wheels", "\0".join(sorted(wheels)).encode()),
                      *((str(p.relative_to(root)), p.read_bytes()) for p in files)])
