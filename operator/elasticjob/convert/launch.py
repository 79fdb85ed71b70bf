"""The worker container of a converted PyTorchJob: its name, its command and its environment. Pure.

A PyTorchJob names its container `pytorch` and, without an elasticPolicy, starts the script with plain `python`,
setting RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT itself. Here the container is `worker` and torchrun runs
the script: torchrun sets the same variables (and LOCAL_RANK) for each process it starts.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from typing import Any

from elasticjob import kit, naming, torchrun
from elasticjob.convert.errors import ConversionError

PYTORCH_CONTAINER = "pytorch"
# torchrun's flags that the operator sets as PET_* environment: a flag on the command line wins over the
# environment, and would pin the agents to a size or a rendezvous the operator does not run.
OPERATOR_FLAGS = frozenset({"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
                            "max-restarts", "master-addr", "master-port", "node-rank", "local-addr", "standalone"})
# torchrun's flags that take no value (every other flag takes one: `--flag=value` or `--flag value`).
BOOLEAN_FLAGS = frozenset({"standalone", "m", "module", "no-python", "run-path"})
LAUNCHER_MODULES = ("torch.distributed.run",)  # torchrun itself, run as a module


@dataclass
class Launch:
    """The worker container as converted, and what the command said that belongs elsewhere in the spec."""

    container: dict[str, Any]
    from_python: bool = False  # the command was plain python, now torchrun
    flags: dict[str, str] = field(default_factory=dict)  # torchrun flags taken off the command (name: value)
    warnings: list[str] = field(default_factory=list)


def worker_container(template: dict[str, Any]) -> tuple[dict[str, Any], Launch]:
    """The template with its `pytorch` container renamed `worker`, its command run by torchrun and its reserved
    environment removed."""
    template = copy.deepcopy(template)
    containers = (template.get("spec") or {}).get("containers") or []
    names = [c.get("name") for c in containers]
    if PYTORCH_CONTAINER not in names:
        raise ConversionError(f"no container named {PYTORCH_CONTAINER!r} (the one a PyTorchJob runs): found "
                              f"{', '.join(map(str, names)) or 'none'}")
    if naming.WORKER_CONTAINER in names:
        raise ConversionError(f"a container is already named {naming.WORKER_CONTAINER!r}: the {PYTORCH_CONTAINER!r} "
                              f"container becomes {naming.WORKER_CONTAINER!r} here; rename the other one")
    container = containers[names.index(PYTORCH_CONTAINER)]
    container["name"] = naming.WORKER_CONTAINER
    launch = Launch(container)
    _command(launch)
    _environment(launch)
    return template, launch


def _command(launch: Launch) -> None:
    container = launch.container
    command = [str(a) for a in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command:
        if not args:
            raise ConversionError("the pytorch container sets no command: the operator needs one that runs "
                                  "torchrun (command: [torchrun, train.py, ...])")
        launch.warnings.append(f"the container sets no command, only args {shlex.join(args)[:120]!r}: the image's "
                               "entrypoint must run torchrun (the operator sets its flags as PET_* environment)")
        return
    program = command[0]
    launcher = command[1:2] == ["-m"] and command[2:3] != [] and command[2] in LAUNCHER_MODULES
    if kit.PYTHONS.match(program) and not launcher:
        _python_to_torchrun(launch, command)
    elif kit.route(command + args) is not None and kit.shell_script(command + args) is None:
        _strip_operator_flags(launch, command, args)
    else:
        launch.warnings.append(f"the command {shlex.join(command + args)[:120]!r} runs as written: it must start "
                               "torchrun without --nnodes, --rdzv-* or --nproc-per-node flags (the operator sets "
                               "them as PET_* environment), and warm starts apply only to torchrun forms")


def _python_to_torchrun(launch: Launch, command: list[str]) -> None:
    rest = command[1:]
    options = []
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        options.append(rest.pop(0))
    # torchrun starts each worker as `python -u`: -u changes nothing; any other interpreter option would be lost.
    dropped = [o for o in options if o != "-u"]
    if dropped:
        raise ConversionError(f"the command passes python the options {' '.join(dropped)}, which torchrun does "
                              f"not take (it starts `python -u SCRIPT` itself): remove them")
    if rest[:1] == ["-m"] and rest[1:2] == ["torch.distributed.launch"]:
        launch.warnings.append("the command runs torch.distributed.launch: kept as written (it reads the same "
                               "PET_* environment; warm starts apply only to torchrun and torch.distributed.run)")
        return
    launch.container["command"] = ["torchrun", *rest]
    launch.from_python = True
    launch.warnings.append(f"the command {shlex.join(command)!r} now runs under torchrun as "
                           f"{shlex.join(launch.container['command'])!r}: one process per pod, with the same "
                           "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and LOCAL_RANK) in its environment")


def _strip_operator_flags(launch: Launch, command: list[str], args: list[str]) -> None:
    """Takes torchrun's flags that the operator sets off the command and args (they come before the script)."""
    tagged = [(0, a) for a in command] + [(1, a) for a in args]
    start = 3 if kit.PYTHONS.match(command[0]) else 1  # `python -m torch.distributed.run` or `torchrun`
    kept, i = tagged[:start], start
    while i < len(tagged):
        origin, token = tagged[i]
        if not token.startswith("-") or token == "--":
            kept += tagged[i:]  # the script and its own arguments
            break
        name, _, value = token.lstrip("-").partition("=")
        name = name.replace("_", "-")
        takes_value = name not in BOOLEAN_FLAGS and "=" not in token
        if takes_value and i + 1 < len(tagged):
            value = tagged[i + 1][1]
        width = 2 if takes_value else 1
        if name in OPERATOR_FLAGS:
            launch.flags[name] = value
        else:
            kept += tagged[i:i + width]
        i += width
    if launch.flags:
        launch.container["command"] = [a for origin, a in kept if origin == 0]
        if args:
            launch.container["args"] = [a for origin, a in kept if origin == 1]
        launch.warnings.append(f"torchrun flags {', '.join('--' + f for f in launch.flags)} taken off the "
                               "command: the operator sets them as PET_* environment")


def _environment(launch: Launch) -> None:
    env = launch.container.get("env")
    if not env:
        return
    reserved = [e for e in env if e.get("name") in torchrun.RESERVED_ENV or str(e.get("name")).startswith("PET_")]
    if reserved:
        launch.container["env"] = [e for e in env if e not in reserved]
        launch.warnings.append(f"environment {', '.join(str(e.get('name')) for e in reserved)} removed: the "
                               "operator or torchrun sets it")
