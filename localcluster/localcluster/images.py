"""Images the local nodes know: what a container of this project's own images would run without a command.

The local cluster runs no images (the repo's .venv stands in for them), so a container that relies on its
image's ENTRYPOINT, as the chart's operator Deployment does (`args` only), needs to know that entrypoint. It is
read from the image's Dockerfile here, never copied: the same file builds the real image, so the chart stays
exactly what a real cluster runs. Only the final stage counts; ENTRYPOINT, CMD and ENV are taken, WORKDIR and
USER are not (there is no image filesystem, and pods run as root here).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# Image name (the last path component of the repository, without tag or digest) -> its Dockerfile in the repo.
KNOWN_IMAGES = {
    "elasticjob-operator": "images/operator.Dockerfile",
}
# Stand-in images: whatever command the container names, the node runs this program instead (as a real image
# whose `python -m elasticjob_store` were this light program would). For benchmarks: storestandin.py.
STAND_INS = {
    "elasticjob-store-standin": ("python", "-m", "localcluster.storestandin"),
}


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    program: tuple[str, ...] = ()  # a stand-in's: runs instead of the container's command and args


def image_name(ref: str) -> str:
    """'registry:5000/team/elasticjob-operator:0.1.0@sha256:...' -> 'elasticjob-operator'."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def config_for(ref: str | None, repo_root: Path) -> ImageConfig | None:
    """The known image's configuration, or None (a container of any other image must name its command)."""
    name = image_name(ref or "")
    if name in STAND_INS:
        return ImageConfig(program=STAND_INS[name])
    dockerfile = KNOWN_IMAGES.get(name)
    return _parse_file(repo_root / dockerfile) if dockerfile else None


@lru_cache(maxsize=8)
def _parse_file(path: Path) -> ImageConfig:
    return parse_dockerfile(path.read_text())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with comments dropped and backslash continuations joined."""
    found, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        if whole:
            word, _, rest = whole.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def exec_form(arguments: str) -> tuple[str, ...]:
    """JSON (exec) form as written; shell form runs under /bin/sh -c, as Docker does."""
    if arguments.startswith("["):
        return tuple(json.loads(arguments))
    return ("/bin/sh", "-c", arguments)


def env_pairs(arguments: str) -> dict[str, str]:
    """`ENV A=1 B="two words"`, or the legacy `ENV A one value`."""
    words = shlex.split(arguments)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words)


_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def parse_dockerfile(text: str) -> ImageConfig:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = {}
    for word, arguments in instructions(text):
        if word == "FROM":  # a new stage: only the last one is the image
            entrypoint, cmd, env = (), (), {}
        elif word == "ENTRYPOINT":
            entrypoint = exec_form(arguments)  # (it also drops a CMD inherited from the base image)
        elif word == "CMD":
            cmd = exec_form(arguments)
        elif word == "ENV":
            for key, value in env_pairs(arguments).items():
                env[key] = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
    return ImageConfig(entrypoint, cmd, env)
