"""A thin async wrapper over the official kubernetes client; API errors become the project's own.

The client is synchronous, so calls run in threads; creates and deletes of one job run concurrently.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from elasticjob.models import GROUP, PLURAL, VERSION

CLIENT_CONNECTIONS = 32


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status, the message is the API server's."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Invalid(KubeError):
    """The API server rejected an object we built from the user's spec (422, or 400 Bad Request)."""


class Forbidden(KubeError):
    pass


_BY_STATUS = {404: NotFound, 409: Conflict, 422: Invalid, 400: Invalid, 403: Forbidden}


def translate(exc: ApiException) -> KubeError:
    message = exc.reason or ""
    try:
        message = json.loads(exc.body or "{}").get("message", message)
    except (ValueError, AttributeError):
        pass
    return _BY_STATUS.get(exc.status, KubeError)(exc.status or 0, exc.reason or "", message)


def api_client() -> kubernetes.client.ApiClient:
    """In-cluster credentials when in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=config)
    config.connection_pool_maxsize = CLIENT_CONNECTIONS
    return kubernetes.client.ApiClient(config)


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except ApiException as exc:
        raise translate(exc) from None


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient):
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    async def create(self, manifest: dict[str, Any]) -> bool:
        """Create a Pod or Service; False when it already exists (409 counts as done)."""
        create = {"Pod": self.core.create_namespaced_pod,
                  "Service": self.core.create_namespaced_service}[manifest["kind"]]
        try:
            await _call(create, manifest["metadata"]["namespace"], manifest)
        except Conflict:
            return False
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None) -> bool:
        """Delete that very pod (by uid, so a replacement of the same name is never hit); gone is done."""
        body = kubernetes.client.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            preconditions=kubernetes.client.V1Preconditions(uid=uid) if uid else None)
        try:
            await _call(self.core.delete_namespaced_pod, name, namespace, body=body)
        except (NotFound, Conflict):
            return False
        return True

    async def delete_service(self, namespace: str, name: str) -> None:
        try:
            await _call(self.core.delete_namespaced_service, name, namespace)
        except NotFound:
            pass

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await _call(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace, PLURAL, name,
                    {"status": status})

    async def patch_job_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        await _call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                    {"spec": spec})

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await _call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                        propagation_policy="Background")
        except NotFound:
            pass

    async def peering_peers(self, name: str, namespace: str | None) -> dict[str, Any]:
        """The peers kopf records in a (Cluster)KopfPeering's status; empty when the object is missing."""
        custom = self.custom
        try:
            if namespace is None:
                body = await _call(custom.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", name)
            else:
                body = await _call(custom.get_namespaced_custom_object, "kopf.dev", "v1", namespace,
                                   "kopfpeerings", name)
        except NotFound:
            return {}
        return dict(body.get("status") or {})

    def close(self) -> None:
        self.client.close()
