"""How a job's pods get the kit (elasticjob_kit): the init container, its volume, and the commands that use it. Pure.

The kit is copied from the operator's image into an emptyDir of each job pod, so that any image with Python and
torch runs the rendezvous store and warm worker starts, at the operator's own version. A worker's command is
routed through the kit's launcher only in the forms that run torchrun; any other command runs as written, and
the job says why (warm_starts).
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass
from typing import Any

from elasticjob.models import ElasticJobSpec, KitSource

DIR = "/opt/elasticjob-kit"
VOLUME = "elasticjob-kit"
INIT_CONTAINER = "elasticjob-kit"
LAUNCH = f"{DIR}/bin/launch"
PATH_DIR = f"{DIR}/path"
# Pod Security "restricted", whatever the pod's own settings; 65532 is the operator image's user.
SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": 65532, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
# Measured: the copy peaks at about 20 MiB (a Python interpreter and 2 MB of files).
RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
SHELLS = re.compile(r"^(.*/)?(sh|bash|dash|ash|zsh)$")
PYTHONS = re.compile(r"^(.*/)?python(3(\.\d+)?)?$")
WARM_MODULE = "elasticjob_warm.torchrun"
TORCHRUN_MODULES = ("torch.distributed.run", WARM_MODULE)
# torchrun's options that take no value (torch/distributed/run.py); each of its other options takes one.
TORCHRUN_FLAGS = {"-h", "--help", "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path",
                  "--run_path", "--virtual-local-rank", "--virtual_local_rank"}
# torchrun's options (and the environment variables its parser reads them from) whose workers no warm server can
# start: the command itself as each worker, or the script run by torchrun's own spawned Python (runpy).
COLD_OPTIONS = {"--no-python": "PET_NO_PYTHON", "--no_python": "PET_NO_PYTHON", "--run-path": "PET_RUN_PATH",
                "--run_path": "PET_RUN_PATH"}
# Why a job with warm starts on still starts cold because of its own command.
# The agent's health endpoint (elasticjob_warm/health.py), which the worker's readiness probe asks: ready while
# its agent is in the rendezvous and hears from the store, so that a pod cut off from the network turns not
# Ready in the kubelet's own words (the operator then replaces it: planner/recovery.py) and READY counts the
# workers in the round. Each pod has its own network, so one port serves every job.
HEALTH_PORT = 29409
HEALTH_ENV = "ELASTICJOB_HEALTH_PORT"
HEALTH_PATH = "/healthz"
# A cut-off agent answers 503 within 2.5 s of its last store answer (health.py: two keep-alives, then a connect
# that gets no answer); two failed probes a second apart then make the pod not Ready, about 4 s after the cut.
# Not one: a pod whose CPU is throttled answers a probe late now and then, and its agent, late with a heartbeat
# too, was taken out of the round for it (seen on real nodes with a worker at a tenth of a core).
HEALTH_PROBE = {"httpGet": {"path": HEALTH_PATH, "port": HEALTH_PORT}, "periodSeconds": 1, "timeoutSeconds": 1,
                "failureThreshold": 2, "successThreshold": 1}
COMMAND_REASONS = ("NoCommand", "CommandNotTorchrun", "TorchrunRunsCold")


@dataclass(frozen=True)
class WarmStarts:
    """What the job's worker container runs: `command` (its args folded in) when warm, else why not."""

    command: list[str] | None
    reason: str
    message: str

    @property
    def on(self) -> bool:
        return self.command is not None


def copied_from(spec: ElasticJobSpec, image: str | None) -> str | None:
    """The image the job's pods copy the kit from (their init container's), or None: no copy, because the
    operator runs without --kit-image or the job's image carries the kit (spec.kit: Image)."""
    return image if spec.kit == KitSource.COPY else None


def warm_starts(spec: ElasticJobSpec, container: dict[str, Any], image: str | None) -> WarmStarts:
    if not spec.warm_starts:
        return WarmStarts(None, "Disabled", "spec.warmStarts is false: torchrun runs as written")
    in_image = spec.kit == KitSource.IMAGE
    if not image and not in_image:
        return WarmStarts(None, "NoKit", "this operator runs without --kit-image: torchrun runs as written")
    argv = [str(a) for a in (container.get("command") or [])]
    if not argv:
        return WarmStarts(None, "NoCommand", "the worker container sets no command; the image's entrypoint "
                                             "runs as is (write `command: [torchrun, ...]` for warm starts)")
    argv += [str(a) for a in (container.get("args") or [])]
    routed = route_in_image(argv) if in_image else route(argv)
    if routed is None:
        shells = "" if in_image else " or a shell running torchrun"
        return WarmStarts(None, "CommandNotTorchrun", f"the worker command {shlex.join(argv)[:200]!r} is not "
                          f"torchrun or `python -m torch.distributed.run`{shells}: it runs as written")
    cold = cold_option(argv, container)
    if cold is not None:
        return WarmStarts(None, "TorchrunRunsCold", f"torchrun's {cold} starts workers that no warm server can fork "
                          "(the command itself, or Python that torchrun spawns): the command runs as written")
    if in_image:
        return WarmStarts(routed, "KitInImage", "torchrun runs through the image's own elasticjob_warm (spec.kit: "
                          "Image): workers are forked from a process that imported torch, rendezvous polls every "
                          "0.1 s")
    return WarmStarts(routed, "KitLauncher", "torchrun runs through elasticjob_warm from the operator's kit: "
                      "workers are forked from a process that imported torch, rendezvous polls every 0.1 s")


def route(argv: list[str]) -> list[str] | None:
    """The command through the kit's launcher, or None for a form that does not run torchrun."""
    program = argv[0]
    if program == "torchrun" or program.endswith("/torchrun"):
        return [LAUNCH, *argv]
    if PYTHONS.match(program) and argv[1:2] == ["-m"] and argv[2:3] and argv[2] in TORCHRUN_MODULES:
        return [LAUNCH, *argv]
    script = shell_script(argv)
    if script is not None and re.search(r"(^|[\s;&|(`])torchrun(\s|$)", argv[script]):
        # The shell finds torchrun on its PATH: the kit's comes first, and the launcher finds the image's.
        return [*argv[:script], f'PATH="{PATH_DIR}:$PATH"; export PATH; ' + argv[script], *argv[script + 1:]]
    return None


def route_in_image(argv: list[str]) -> list[str] | None:
    """The command through the image's own elasticjob_warm.torchrun, or None. No launcher to find the Python that
    runs torchrun: `python` on the image's PATH runs it. A shell's torchrun cannot be routed without the kit's
    path/ (the launcher named torchrun): it runs as written."""
    program = argv[0]
    if program == "torchrun" or program.endswith("/torchrun"):
        return ["python", "-m", WARM_MODULE, *argv[1:]]
    if PYTHONS.match(program) and argv[1:2] == ["-m"] and argv[2:3] and argv[2] in TORCHRUN_MODULES:
        return [program, "-m", WARM_MODULE, *argv[3:]]
    return None


def cold_option(argv: list[str], container: dict[str, Any]) -> str | None:
    """The option of torchrun's (or PET_ variable set to 1) that keeps its workers cold, when the spec shows it.
    A shell's torchrun is not looked into: its agent finds out itself and tells the job (PlainTorchrun)."""
    args = [] if shell_script(argv) is not None else argv[3:] if PYTHONS.match(argv[0]) else argv[1:]
    for option in torchrun_options(args):
        if option.split("=", 1)[0] in COLD_OPTIONS:
            return option.split("=", 1)[0]
    env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
    for option, variable in COLD_OPTIONS.items():
        if str(env.get(variable) or "0").strip() not in ("0", ""):
            return f"{option} (from {variable})"
    return None


def torchrun_options(args: list[str]) -> list[str]:
    """torchrun's own options at the head of its arguments, the script's (which may look alike) left out."""
    options, i = [], 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        arg = args[i]
        options.append(arg)
        attached = "=" in arg or (not arg.startswith("--") and len(arg) > 2)  # --opt=value, -r3
        i += 1 if attached or arg in TORCHRUN_FLAGS or arg in COLD_OPTIONS else 2
    return options


def shell_script(argv: list[str]) -> int | None:
    """Where the script of `sh -c SCRIPT` (or -lc, -ec, ...) is in argv; None for anything else."""
    if not SHELLS.match(argv[0]):
        return None
    for i, arg in enumerate(argv[1:], start=1):
        if not arg.startswith("-") or arg == "--":
            return None
        if "c" in arg[1:] and not arg.startswith("--"):
            return i + 1 if i + 1 < len(argv) else None
    return None


def add_to_pod(spec: dict[str, Any], image: str) -> None:
    """The emptyDir and the init container that fills it (first, so that later init containers may use it)."""
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": VOLUME, "emptyDir": {"sizeLimit": "32Mi"}}]
    spec["initContainers"] = [{
        "name": INIT_CONTAINER,
        "image": image,
        "command": ["python", "-m", "elasticjob_kit", DIR],
        "volumeMounts": [{"name": VOLUME, "mountPath": DIR}],
        "resources": copy.deepcopy(RESOURCES),
        "securityContext": copy.deepcopy(SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }, *(spec.get("initContainers") or [])]


def mount(container: dict[str, Any]) -> None:
    container["volumeMounts"] = [*(container.get("volumeMounts") or []),
                                 {"name": VOLUME, "mountPath": DIR, "readOnly": True}]


def use_in_worker(spec: dict[str, Any], container: dict[str, Any], command: list[str], image: str | None) -> None:
    """The worker runs `command` (warm_starts'), with the kit copied from `image`, or from its own image (None)."""
    if image:
        add_to_pod(spec, image)
        mount(container)
        # Only with the kit copied at the operator's own version: an image's own kit may predate the endpoint,
        # and a probe nothing answers would keep every worker unready for ever.
        add_health_probe(container)
    container["command"] = command
    container.pop("args", None)


def add_health_probe(container: dict[str, Any]) -> None:
    """The agent's health endpoint and the readiness probe that asks it (HEALTH_PROBE), unless the template has a
    readiness probe of its own: that one is the user's word on readiness and stands."""
    if container.get("readinessProbe"):
        return
    container["env"] = [*(container.get("env") or []), {"name": HEALTH_ENV, "value": str(HEALTH_PORT)}]
    container["readinessProbe"] = copy.deepcopy(HEALTH_PROBE)


def store_command(image: str | None) -> list[str]:
    return [LAUNCH, "store"] if image else ["python", "-m", "elasticjob_store"]

