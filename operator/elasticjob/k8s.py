"""A thin async wrapper over the official kubernetes client; API errors become the project's own.

The client is synchronous, so calls run in threads (a pool sized in handlers/startup.py). Responses the
operator does not read are not decoded into client models: at fleet size that was most of its CPU.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from elasticjob.models import GROUP, PLURAL, VERSION

CLIENT_CONNECTIONS = 32
# Objects of other APIs the jobs own: kind -> plural.
CUSTOM_PLURALS = {"PodGroup": "podgroups", "Workload": "workloads"}
# How the API server says a ResourceQuota is exhausted (403, like a policy refusal, but transient).
QUOTA_MARKER = "exceeded quota"


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status, the message is the API server's."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: the object exists already, or a resourceVersion precondition failed."""


class Invalid(KubeError):
    """The API server rejected an object we built from the user's spec (422, or 400 Bad Request)."""


class Forbidden(KubeError):
    """403: RBAC, Pod Security admission, a ResourceQuota, an admission webhook said no."""


class Gone(KubeError):
    """410: a resourceVersion or a list's continue token is too old."""


class Unavailable(KubeError):
    """No answer at all: the API server is down or unreachable (a restart, a network fault)."""


class Unknown:
    """An answer the API server did not give."""


UNKNOWN = Unknown()


_BY_STATUS = {404: NotFound, 409: Conflict, 422: Invalid, 400: Invalid, 403: Forbidden, 410: Gone}


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


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except ApiException as exc:
        raise translate(exc) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Unavailable(0, "Unavailable", f"no answer from the API server: {exc}") from None


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient):
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.networking = kubernetes.client.NetworkingV1Api(client)
        self.scheduling = kubernetes.client.SchedulingV1Api(client)
        self._creators = {"Pod": self.core.create_namespaced_pod,
                          "Service": self.core.create_namespaced_service,
                          "Secret": self.core.create_namespaced_secret,
                          "NetworkPolicy": self.networking.create_namespaced_network_policy}

    # --- objects the jobs own ---------------------------------------------------------------------------

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Pod, Service, Secret, NetworkPolicy, PodGroup or Kueue Workload: the object as the API
        server stored it, or None when it already exists (409 counts as done)."""
        namespace = manifest["metadata"]["namespace"]
        try:
            if manifest["kind"] in self._creators:
                response = await _call(self._creators[manifest["kind"]], namespace, manifest, _preload_content=False)
            else:
                group, version = manifest["apiVersion"].split("/")
                response = await _call(self.custom.create_namespaced_custom_object, group, version, namespace,
                                       CUSTOM_PLURALS[manifest["kind"]], manifest, _preload_content=False)
        except Conflict:
            return None
        return _json(response)

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None) -> bool:
        """Delete that very pod (by uid, so a replacement of the same name is never hit); gone is done."""
        body = {"gracePeriodSeconds": grace_seconds, "preconditions": {"uid": uid} if uid else None}
        try:
            await _call(self.core.delete_namespaced_pod, name, namespace,
                        body={k: v for k, v in body.items() if v is not None}, _preload_content=False)
        except (NotFound, Conflict):
            return False
        return True

    async def delete_service(self, namespace: str, name: str, uid: str | None = None) -> bool:
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await _call(self.core.delete_namespaced_service, name, namespace, body=body, _preload_content=False)
        except (NotFound, Conflict):
            return False
        return True

    async def controller_ref(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The controlling ownerReference of a Pod or Service as stored now; None when it has none or is gone."""
        read = self.core.read_namespaced_pod if kind == "Pod" else self.core.read_namespaced_service
        try:
            body = _json(await _call(read, name, namespace, _preload_content=False))
        except NotFound:
            return None
        return next((r for r in body["metadata"].get("ownerReferences") or [] if r.get("controller")), None)

    async def pod_log_tail(self, namespace: str, name: str, container: str, lines: int) -> str:
        """The last lines a container wrote ('' when the kubelet cannot say)."""
        try:
            response = await _call(self.core.read_namespaced_pod_log, name, namespace, container=container,
                                   tail_lines=lines, limit_bytes=64 * 1024, _preload_content=False)
        except (NotFound, KubeError):
            return ""
        return response.data.decode(errors="replace")

    async def node_ready(self, name: str) -> bool | None | Unknown:
        """True/False from the node's Ready condition; None when the node no longer exists; UNKNOWN when the
        API server would not say (the caller then acts as if it had not asked)."""
        try:
            body = _json(await _call(self.core.read_node, name, _preload_content=False))
        except NotFound:
            return None
        except KubeError:
            return UNKNOWN
        conditions = (body.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    # --- objects of other APIs (PodGroups, Kueue) ----------------------------------------------------------

    async def get_object(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        """A namespaced (or, without namespace, cluster-scoped) custom object; None when there is none."""
        group, version = api_version.split("/")
        try:
            if namespace is None:
                response = await _call(self.custom.get_cluster_custom_object, group, version, plural, name,
                                       _preload_content=False)
            else:
                response = await _call(self.custom.get_namespaced_custom_object, group, version, namespace,
                                       plural, name, _preload_content=False)
        except NotFound:
            return None
        return _json(response)

    async def delete_object(self, api_version: str, plural: str, namespace: str, name: str, uid: str) -> bool:
        group, version = api_version.split("/")
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await _call(self.custom.delete_namespaced_custom_object, group, version, namespace, plural, name,
                        body=body, _preload_content=False)
        except (NotFound, Conflict):
            return False
        return True

    async def patch_object(self, api_version: str, plural: str, namespace: str, name: str,
                           patch: dict[str, Any]) -> None:
        """A merge patch (put the resourceVersion in the patch to make it conditional)."""
        group, version = api_version.split("/")
        await _call(self.custom.patch_namespaced_custom_object, group, version, namespace, plural, name, patch,
                    _preload_content=False)

    async def apply_status(self, api_version: str, plural: str, body: dict[str, Any], manager: str) -> None:
        """Server-side apply of an object's status as `manager`, forced (its resourceVersion, if in the
        body, makes it conditional)."""
        group, version = api_version.split("/")
        meta = body["metadata"]
        await _call(self.custom.patch_namespaced_custom_object_status, group, version, meta["namespace"], plural,
                    meta["name"], body, field_manager=manager, force=True,
                    _content_type="application/apply-patch+yaml", _preload_content=False)

    async def priority_class_value(self, name: str) -> int | None:
        """The value of a (pod) PriorityClass; None when there is none."""
        try:
            body = _json(await _call(self.scheduling.read_priority_class, name, _preload_content=False))
        except NotFound:
            return None
        return int(body.get("value", 0))

    # --- the jobs ---------------------------------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return await _call(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any],
                               resource_version: str) -> dict[str, Any]:
        """Write status only if the job is still at the version it was planned from (else Conflict)."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return await _call(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace, PLURAL,
                           name, patch)

    async def patch_job_spec(self, namespace: str, name: str, spec: dict[str, Any],
                             resource_version: str) -> dict[str, Any]:
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": spec}
        return await _call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                           patch)

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        try:
            await _call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                        propagation_policy="Background", body={"preconditions": {"uid": uid}})
        except (NotFound, Conflict):
            pass

    # --- events -----------------------------------------------------------------------------------------

    async def post_event(self, event: dict[str, Any]) -> None:
        await _call(self.core.create_namespaced_event, event["metadata"]["namespace"], event,
                    _preload_content=False)

    # --- kopf peering ------------------------------------------------------------------------------------

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
