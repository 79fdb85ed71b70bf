"""The taints of nodes that stay bad, written (--taint-bad-nodes; the patches are elasticjob/taints.py's).

A job's plan asks for a node's taint while it avoids the node and for its removal when the avoidance ends
(planner/nodes.py taint); the taint goes only once the end written on the node (the latest of every job's) is
past. What no plan removes (the job with the latest end deleted, finished or its avoidNodeSeconds lowered first,
the operator down at that moment) the leader's sweep removes: every SWEEP_SECONDS it lists the nodes labelled as
tainted by the operator (a label selector: the API server's cache answers, with those nodes alone) and untaints
those whose end is past. A taint thus outlives the last avoidance of its node by at most a minute, whatever
happened to the job; and the nodes are not watched (their status changes every few seconds on a large cluster).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from elasticjob import k8s, planner, taints
from elasticjob.controller.context import Context

CONFLICT_RETRIES = 3
SWEEP_SECONDS = 60.0


async def taint(kube: k8s.Kube, action: planner.TaintNode) -> bool:
    """Whether the node changed (its Event is posted only then); a node gone is nothing to do."""
    return await change(kube, action.node, lambda node: taints.taint_patch(node, action.reason, action.until))


async def untaint(kube: k8s.Kube, name: str, now: datetime) -> bool:
    """Whether the taint was removed: only once the end written on the node is past."""
    return await change(kube, name, lambda node: taints.untaint_patch(node, now))


async def change(kube: k8s.Kube, name: str, patch_of: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
    """Read the node, patch it under the resourceVersion read; read again when it changed meanwhile (a kubelet's
    status update). A Forbidden goes to the caller (no RBAC: apply.py shows it on the job)."""
    for _ in range(CONFLICT_RETRIES):
        node = await kube.get_node(name)
        patch = patch_of(node) if node is not None else None
        if patch is None:
            return False
        try:
            await kube.patch_node(name, patch)
        except k8s.NotFound:
            return False
        except k8s.Conflict:
            continue
        return True
    # Not a Conflict: reconcile.py takes that for the job's own lost race and reads the job again.
    raise k8s.KubeError(409, "Conflict", f"node {name} changed at each of {CONFLICT_RETRIES} reads while its "
                        f"taint {taints.KEY} was written")


async def sweep(kube: k8s.Kube, now: datetime) -> list[str]:
    """Untaint every node of the operator's whose end is past; the names of those untainted."""
    done = []
    for node in await kube.list_nodes(taints.KEY):
        name = node["metadata"]["name"]
        if taints.untaint_patch(node, now) is not None and await untaint(kube, name, now):
            done.append(name)
    return done


async def sweep_forever(ctx: Context, every: float = SWEEP_SECONDS) -> None:
    """The leader's sweep, for as long as the operator runs; an error is logged and the next sweep tries again."""
    log = logging.LoggerAdapter(ctx.logger, {})
    refused = False
    while True:
        if ctx.gate.active:
            try:
                for name in await sweep(ctx.kube, datetime.now(UTC)):
                    log.info(f"node {name}: taint {taints.KEY} removed, no job's avoidance of it runs any more")
            except k8s.Forbidden as exc:
                if not refused:  # once: the same words every minute say nothing more
                    log.warning(f"cannot list or untaint nodes (--taint-bad-nodes needs list and patch on nodes: "
                                f"the chart's badNodes.taint grants them): {exc.message}")
                refused = True
            except k8s.KubeError as exc:
                log.warning(f"sweeping the nodes' taints: {exc}")
        await asyncio.sleep(every)
