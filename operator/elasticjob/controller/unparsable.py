"""A stored spec the model refuses: written before a schema change, or by a client that bypassed the CRD's
validation. Nothing can be planned from it and retrying cannot help, so the job fails once, visibly (phase
Failed, reason InvalidSpec, a message naming the fields, one Warning Event), and is tried again only when its
spec changes (a new metadata.generation). Pure; controller/reconcile.py writes and posts what it decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import ValidationError

from elasticjob.models import ElasticJobStatus, Phase
from elasticjob.planner.base import set_condition, stamp

# pydantic lists every field it refused: the message shows the first few, each cut short, so that a spec with
# many bad fields (or an error quoting a long value) still makes a status and an Event a person can read.
ERRORS_SHOWN = 3
ERROR_CHARS = 200


def message(exc: ValidationError) -> str:
    """Which fields, and pydantic's words for each: 'spec does not parse: spec.minReplicas: Input should be…'."""
    errors = exc.errors(include_url=False, include_input=False)
    said = "; ".join(f"{field_path(e['loc'])}: {_cut(e['msg'])}" for e in errors[:ERRORS_SHOWN])
    more = f" (and {len(errors) - ERRORS_SHOWN} more)" if len(errors) > ERRORS_SHOWN else ""
    return f"spec does not parse: {said}{more}"


def field_path(loc: Sequence[int | str]) -> str:
    """pydantic's loc as a path in the object a person edits: ('template', 'containers', 0) is
    spec.template.containers[0]."""
    return "spec" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def reported(status: ElasticJobStatus, generation: int) -> bool:
    """Nothing to do: the job already failed for this generation of its spec, or finished before it stopped
    parsing (a finished job is not failed afresh; its status says how it ended)."""
    if not status.phase.finished:
        return False
    return status.reason != "InvalidSpec" or status.observed_generation == generation


def failed(status: ElasticJobStatus, generation: int, said: str, now: datetime) -> ElasticJobStatus:
    """The job's status, Failed with reason InvalidSpec for this generation."""
    new = status.model_copy(deep=True)
    new.phase, new.reason, new.message = Phase.FAILED, "InvalidSpec", said
    new.observed_generation = generation
    if not new.completion_time:
        new.completion_time = stamp(now)
    for kind in ("Running", "Restarting", "Succeeded", "Failed", "Suspended"):  # as planner/base.py's enter_phase
        active = kind == "Failed"
        set_condition(new, kind, active, "InvalidSpec" if active else f"Not{kind}", said if active else "", now,
                      generation)
    return new


def _cut(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"
