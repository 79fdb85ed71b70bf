"""The taint of a node that stays bad (--taint-bad-nodes), as patches of the node. Pure.

A node a job avoids for a reason of the node's own (planner/nodes.py SICK) gets the taint elasticjob.dev/unhealthy
with the reason as its value and effect NoSchedule: no new pod that does not tolerate it is scheduled there, of
any job or of anything else; running pods stay. Beside it, in the same patch, the annotation
elasticjob.dev/unhealthy-until (when the taint may go: the latest end of every job's avoidance that wrote it, only
ever moved later) and the label elasticjob.dev/unhealthy (the reason again: the operator finds its tainted nodes by
it, and `kubectl get nodes -L elasticjob.dev/unhealthy` shows them). One patch, so an operator killed between
two writes leaves no taint without its end.

The node's spec.taints is an atomic list (any patch replaces it whole): each patch carries the resourceVersion it
was computed from, and a Conflict means read the node and compute again (controller/node_taints.py).

The annotation is what makes a taint of that key the operator's: one without it (an administrator's
`kubectl taint`) is neither changed nor removed. A taint removed by hand before its end stays removed for the
ends already written; a later avoidance taints the node again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from elasticjob import naming

KEY = naming.UNHEALTHY_TAINT  # the taint's key, and the label the sweep lists by
UNTIL = naming.UNHEALTHY_UNTIL_ANNOTATION
EFFECT = "NoSchedule"


def parse(value: str | None) -> datetime | None:
    """An RFC 3339 time as the operator writes it; None when there is none or it does not read as one."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def written_until(node: dict[str, Any]) -> tuple[bool, datetime | None]:
    """Whether the node carries the operator's annotation, and the end it says (None: unreadable)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return UNTIL in annotations, parse(annotations.get(UNTIL))


def is_ours(taint: dict[str, Any]) -> bool:
    return taint.get("key") == KEY and taint.get("effect") == EFFECT


def taint_patch(node: dict[str, Any], reason: str, until: str) -> dict[str, Any] | None:
    """The patch that taints `node` for `reason` until `until`; None when there is nothing to write: an end as late
    or later is written already (the taint there, or removed by hand), a taint of the key is someone else's (no
    annotation), or the annotation does not read as a time."""
    taints: list[dict[str, Any]] = (node.get("spec") or {}).get("taints") or []
    annotated, written = written_until(node)
    wanted = parse(until)
    if wanted is None or (annotated and written is None):
        return None
    if not annotated and any(t.get("key") == KEY for t in taints):
        return None  # someone else's
    if written is not None and written >= wanted:
        return None
    mine = {"key": KEY, "value": reason, "effect": EFFECT}
    if any(is_ours(t) for t in taints):
        updated = [mine if is_ours(t) else t for t in taints]
    else:
        updated = [*taints, mine]
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "labels": {KEY: reason},
                         "annotations": {UNTIL: until}},
            "spec": {"taints": updated}}


def untaint_patch(node: dict[str, Any], now: datetime) -> dict[str, Any] | None:
    """The patch that removes the operator's taint, label and annotation once the end written is past; None
    while it is not (another job's avoidance, or a later one, still runs) or where the taint is not the
    operator's (no annotation, or one that does not read as a time)."""
    _, written = written_until(node)
    if written is None or written > now:
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                                          "labels": {KEY: None}, "annotations": {UNTIL: None}}}
    taints: list[dict[str, Any]] = (node.get("spec") or {}).get("taints") or []
    if any(is_ours(t) for t in taints):
        patch["spec"] = {"taints": [t for t in taints if not is_ours(t)]}
    return patch
