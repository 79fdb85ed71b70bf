"""Whether this torch is one the warm wrapper may patch and fork for: checked as `elasticjob_warm.torchrun` starts.

The wrapper reaches into torch in three ways: it drives torchrun's own argument parser and `run` (torchrun.py),
it replaces the private `_delay` and the state holder's cache duration (polling.py), and its server forks
workers from a process that imported torch (server.py). Outside the torch minors `make compat` has run those
against, or when a name is missing, it runs plain torchrun instead, and says so in the pod's log.
The version is read from the package's metadata, so that the check costs no `import torch` before the warm
server starts importing it.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from typing import Any

# Keep equal to elasticjob_store.compat.SUPPORTED (a unit test checks): one range for the worker image.
SUPPORTED = ((2, 6), (2, 13))
RANGE_TEXT = f"{SUPPORTED[0][0]}.{SUPPORTED[0][1]} to {SUPPORTED[1][0]}.{SUPPORTED[1][1]}"
# What torchrun.py reads from and writes to torchrun's parsed arguments.
AGENT_ARGS = ("nnodes", "no_python", "module", "training_script", "training_script_args")


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def in_range(version: str) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and SUPPORTED[0] <= (int(match[1]), int(match[2])) <= SUPPORTED[1]


def version_problem(version: str) -> str | None:
    """Why this torch gets plain torchrun, judged by its version alone; None when it is in the range."""
    if not version:
        return "torch's version is unknown (no package metadata)"
    if not in_range(version):
        return f"torch {version} is outside the range the wrapper was tested on ({RANGE_TEXT})"
    return None


def agent_problem(run: Any) -> str | None:
    """Why torchrun's module (torch.distributed.run) is not the one the wrapper drives; None when it is."""
    for name in ("parse_args", "run"):
        if not callable(getattr(run, name, None)):
            return f"torch.distributed.run.{name} is missing"
    try:
        args = run.parse_args(["--nnodes=1:2", "script.py", "arg"])
    except BaseException as err:  # noqa: BLE001 - argparse exits on what it does not know
        return f"torchrun's parser refused a plain command line: {type(err).__name__}: {err}"
    missing = [name for name in AGENT_ARGS if not hasattr(args, name)]
    if missing:
        return f"torchrun's parsed arguments lack {', '.join(missing)}"
    if (args.training_script, args.training_script_args, args.nnodes) != ("script.py", ["arg"], "1:2"):
        return "torchrun's parser reads a command line differently"
    return None


def polling_problem(rdzv: Any) -> str | None:
    """Why polling.py cannot patch this rendezvous module (dynamic_rendezvous); None when it can."""
    delay = getattr(rdzv, "_delay", None)
    if delay is None or "seconds" not in inspect.signature(delay).parameters:
        return "dynamic_rendezvous._delay(seconds) is missing"
    holder = getattr(rdzv, "_BackendRendezvousStateHolder", None)
    if holder is None or "cache_duration" not in inspect.signature(holder.__init__).parameters:
        return "the state holder takes no cache_duration"
    return None
