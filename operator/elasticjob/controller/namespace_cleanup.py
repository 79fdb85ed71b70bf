"""What the operator made for a namespace's jobs goes with the last of them.

The NetworkPolicies around a namespace's stores and workers are shared by its jobs, so no job owns them and the
garbage collector never removes them. When the namespace's last job leaves, they are deleted here, once the
jobs' pods are gone too (the garbage collector deletes them after their job, and a store or worker still
terminating must not stand unfenced), or not at all if a job comes back meanwhile: only while they still carry
the operator's label, and only the object that was read (uid and resourceVersion), so a policy a user made
under the same name, or changed since, stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from elasticjob import builders, k8s

POLICIES = (builders.NAMESPACE_POLICY, builders.WORKER_POLICY)
API = ("networking.k8s.io/v1", "networkpolicies")


# How long the deletion waits for the jobs' pods to go, and how often it looks (at the operator's own cache).
POD_WAIT = 600.0
LOOK_EVERY = 1.0


async def delete_policies(kube: k8s.Kube, namespace: str, logger: logging.Logger,
                          pods_left: Callable[[], bool] = lambda: False,
                          jobs_back: Callable[[], bool] = lambda: False, wait: float = POD_WAIT) -> None:
    """`pods_left`: whether pods of the namespace's jobs still stand; `jobs_back`: whether a job came back (then
    the policies stay, and the wait ends at once: a new job's create waits for this)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while pods_left() and not jobs_back():
        if loop.time() >= deadline:
            logger.warning(f"[{namespace}] the ElasticJobs' pods still stand {wait:.0f}s after the last job left; "
                           f"deleting the NetworkPolicies around them anyway")
            break
        await asyncio.sleep(LOOK_EVERY)  # the pod watch updates the cache; nothing to wait on but time
    if jobs_back():
        return
    for name in POLICIES:
        try:
            await _delete_if_ours(kube, namespace, name, logger)
        except k8s.KubeError as exc:  # RBAC of an older chart, the API server away: the policy only lingers
            logger.warning(f"[{namespace}] could not delete NetworkPolicy {name} after the namespace's last "
                           f"ElasticJob: {exc}")


async def _delete_if_ours(kube: k8s.Kube, namespace: str, name: str, logger: logging.Logger) -> None:
    body = await kube.get_object(*API, namespace, name)
    if body is None:
        return
    meta = body.get("metadata") or {}
    if not builders.MANAGED_BY.items() <= (meta.get("labels") or {}).items():
        return
    # Changed or replaced since it was read (a 409 on the preconditions): no longer what the operator made.
    if await kube.delete_object(*API, namespace, name, meta.get("uid", ""), meta.get("resourceVersion", "")):
        logger.info(f"[{namespace}] deleted NetworkPolicy {name}: the namespace has no ElasticJob left")
