"""What the operator made for a namespace's jobs goes with the last of them.

The NetworkPolicies around a namespace's stores and workers are shared by its jobs, so no job owns them and the
garbage collector never removes them. When the namespace's last job leaves, they are deleted here: only while
they still carry the operator's label, and only the object that was read (uid and resourceVersion), so a
policy a user made under the same name, or changed since, stays.
"""

from __future__ import annotations

import logging

from elasticjob import builders, k8s

POLICIES = (builders.NAMESPACE_POLICY, builders.WORKER_POLICY)
API = ("networking.k8s.io/v1", "networkpolicies")


async def delete_policies(kube: k8s.Kube, namespace: str, logger: logging.Logger) -> None:
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
