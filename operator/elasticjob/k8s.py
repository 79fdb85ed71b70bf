"""A thin async wrapper over the official kubernetes client; API errors become the project's own.

The client is synchronous, so calls run in threads (a pool sized in controller/kopf_app.py). Calls go by path
(rest.py), bodies are dicts: decoding replies into client models was most of the operator's CPU at fleet size,
and the generated API classes a third of its memory.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any

import kubernetes
import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

from elasticjob import lease, rest
from elasticjob.models import API_VERSION, PLURAL

CLIENT_CONNECTIONS = 32
# The kinds of core APIs the jobs own -> their plural (the path of their collection); an integration names the
# plural of its own kinds (planner.CreateObject.plural).
PLURALS = {"Pod": "pods", "Service": "services", "NetworkPolicy": "networkpolicies",
           "EndpointSlice": "endpointslices"}
FIELD_MANAGER = "elasticjob-operator"
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


def api_client(connections: int = CLIENT_CONNECTIONS) -> kubernetes.client.ApiClient:
    """In-cluster credentials when in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config). `connections`:
    as many as threads use it at once; a request beyond them opens a connection (a TLS handshake) and drops it."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=config)
    config.connection_pool_maxsize = connections
    return kubernetes.client.ApiClient(config)


async def _call(fn: Callable[..., Any], *args: Any, executor: Executor | None = None, **kwargs: Any) -> Any:
    try:
        if executor is None:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args, **kwargs))
    except ApiException as exc:
        raise translate(exc) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Unavailable(0, "Unavailable", f"no answer from the API server: {exc}") from None


def _json(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(response.data)
    return body


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient, executor: Executor | None = None):
        """`executor`: the threads its calls run in (None: the event loop's default pool)."""
        self.client, self.executor = client, executor

    async def _send(self, method: str, url_path: str, **kwargs: Any) -> Any:
        return await _call(rest.call, self.client, method, url_path, executor=self.executor, **kwargs)

    async def _get(self, url_path: str, **kwargs: Any) -> dict[str, Any]:
        return _json(await self._send("GET", url_path, **kwargs))

    def lister(self, url_path: str) -> Callable[..., Any]:
        """A list-and-watch call of one collection, for the reflector."""
        return rest.lister(self.client, url_path)

    # --- objects the jobs own ---------------------------------------------------------------------------

    async def create(self, manifest: dict[str, Any], plural: str | None = None) -> dict[str, Any] | None:
        """Create a Pod, Service, NetworkPolicy, or an integration's object (a PodGroup, a Kueue Workload: its
        `plural` given): the object as the API server stored it, or None when it already exists (409 is done)."""
        url_path = rest.resource(manifest["apiVersion"], manifest["metadata"]["namespace"],
                                 plural or PLURALS[manifest["kind"]])
        try:
            return _json(await self._send("POST", url_path, body=manifest))
        except Conflict:
            return None

    async def apply(self, manifest: dict[str, Any]) -> None:
        """Server-side apply of a whole object this operator keeps (created when missing), forced."""
        meta = manifest["metadata"]
        url_path = rest.resource(manifest["apiVersion"], meta["namespace"], PLURALS[manifest["kind"]], meta["name"])
        await self._send("PATCH", url_path, body=manifest, content_type=rest.APPLY_PATCH,
                         query={"fieldManager": FIELD_MANAGER, "force": True})

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None) -> bool:
        """Delete that very pod (by uid, so a replacement of the same name is never hit); gone is done."""
        body = {"gracePeriodSeconds": grace_seconds, "preconditions": {"uid": uid} if uid else None}
        return await self._delete(rest.resource("v1", namespace, "pods", name),
                                  {k: v for k, v in body.items() if v is not None})

    async def delete_service(self, namespace: str, name: str, uid: str | None = None) -> bool:
        body = {"preconditions": {"uid": uid}} if uid else None
        return await self._delete(rest.resource("v1", namespace, "services", name), body)

    async def _delete(self, url_path: str, body: dict[str, Any] | None, **query: Any) -> bool:
        """True when this call deleted it; gone already, or another object by now (uid), is False."""
        try:
            await self._send("DELETE", url_path, body=body, query=query)
        except (NotFound, Conflict):
            return False
        return True

    async def controller_ref(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The controlling ownerReference of a Pod or Service as stored now; None when it has none or is gone."""
        plural = "pods" if kind == "Pod" else "services"
        try:
            body = await self._get(rest.resource("v1", namespace, plural, name))
        except NotFound:
            return None
        return next((r for r in body["metadata"].get("ownerReferences") or [] if r.get("controller")), None)

    async def metadata(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The metadata of a Pod or Service as stored now; None when there is none (whose is a name that a create
        was refused for, 409)."""
        try:
            body = await self._get(rest.resource("v1", namespace, PLURALS[kind], name))
        except NotFound:
            return None
        meta: dict[str, Any] = body.get("metadata") or {}
        return meta

    async def pod_log_tail(self, namespace: str, name: str, container: str, lines: int,
                           since: datetime | None = None) -> str:
        """The last lines a container wrote ('' when the kubelet cannot say); with `since`, only those the
        kubelet timestamped from then on (its clock, not the workload's word)."""
        query: dict[str, Any] = {"container": container, "tailLines": lines, "limitBytes": 64 * 1024}
        if since is not None:
            query["sinceTime"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            response = await self._send("GET", rest.resource("v1", namespace, "pods", name, "log"),
                                        query=query)
        except KubeError:
            return ""
        return str(response.data.decode(errors="replace"))

    async def node_ready(self, name: str) -> bool | None | Unknown:
        """True/False from the node's Ready condition; None when the node no longer exists; UNKNOWN when the
        API server would not say (the caller then acts as if it had not asked)."""
        try:
            body = await self._get(rest.resource("v1", None, "nodes", name))
        except NotFound:
            return None
        except KubeError:
            return UNKNOWN
        conditions = (body.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """The node as stored now; None when there is none."""
        try:
            return await self._get(rest.resource("v1", None, "nodes", name))
        except NotFound:
            return None

    async def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        """The nodes with these labels (the operator's tainted ones, --taint-bad-nodes)."""
        found = await self._get(rest.resource("v1", None, "nodes"), query={"labelSelector": label_selector})
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of a node (its metadata.resourceVersion in the patch makes it conditional: Conflict)."""
        return _json(await self._send("PATCH", rest.resource("v1", None, "nodes", name), body=patch,
                                      content_type=rest.MERGE_PATCH))

    # --- objects of other APIs (PodGroups, Kueue) ----------------------------------------------------------

    async def get_object(self, api_version: str, plural: str, namespace: str | None,
                         name: str) -> dict[str, Any] | None:
        """A namespaced (or, without namespace, cluster-scoped) custom object; None when there is none."""
        try:
            return await self._get(rest.resource(api_version, namespace, plural, name))
        except NotFound:
            return None

    async def served(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves this resource now (discovery, readable by every authenticated user)."""
        try:
            found = await self._get(f"/apis/{api_version}")
        except NotFound:
            return False
        return any(r.get("name") == plural for r in found.get("resources") or [])

    async def delete_object(self, api_version: str, plural: str, namespace: str, name: str, uid: str,
                            resource_version: str = "") -> bool:
        """Deleted only while it is still that object (uid) and, when given, unchanged since it was read."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"preconditions": preconditions} if preconditions else None
        return await self._delete(rest.resource(api_version, namespace, plural, name), body)

    async def patch_object(self, api_version: str, plural: str, namespace: str, name: str,
                           patch: dict[str, Any]) -> None:
        """A merge patch (put the resourceVersion in the patch to make it conditional)."""
        await self._send("PATCH", rest.resource(api_version, namespace, plural, name),
                         body=patch, content_type=rest.MERGE_PATCH)

    async def apply_status(self, api_version: str, plural: str, body: dict[str, Any], manager: str) -> None:
        """Server-side apply of an object's status as `manager`, forced (its resourceVersion, if in the
        body, makes it conditional)."""
        meta = body["metadata"]
        await self._send("PATCH", rest.resource(api_version, meta["namespace"], plural, meta["name"], "status"),
                         body=body, content_type=rest.APPLY_PATCH, query={"fieldManager": manager, "force": True})

    async def priority_class_value(self, name: str) -> int | None:
        """The value of a (pod) PriorityClass; None when there is none."""
        try:
            body = await self._get(rest.resource("scheduling.k8s.io/v1", None, "priorityclasses", name))
        except NotFound:
            return None
        return int(body.get("value", 0))

    # --- the jobs ---------------------------------------------------------------------------------------

    def _job(self, namespace: str, name: str, sub: str | None = None) -> str:
        return rest.resource(API_VERSION, namespace, PLURAL, name, sub)

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._get(self._job(namespace, name))

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any],
                               resource_version: str) -> dict[str, Any]:
        """Write status only if the job is still at the version it was planned from (else Conflict)."""
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return _json(await self._send("PATCH", self._job(namespace, name, "status"), body=patch,
                                      content_type=rest.MERGE_PATCH))

    async def patch_job_spec(self, namespace: str, name: str, spec: dict[str, Any],
                             resource_version: str) -> dict[str, Any]:
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": spec}
        return _json(await self._send("PATCH", self._job(namespace, name), body=patch,
                                      content_type=rest.MERGE_PATCH))

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(self._job(namespace, name), {"preconditions": {"uid": uid}},
                           propagationPolicy="Background")

    # --- events -----------------------------------------------------------------------------------------

    async def post_event(self, event: dict[str, Any]) -> None:
        await self._send("POST", rest.resource("v1", event["metadata"]["namespace"], "events"), body=event)

    # --- the leader's Lease (coordination.k8s.io) -------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
        try:
            return await self._get(rest.resource(lease.API_VERSION, namespace, lease.PLURAL, name), timeout=timeout)
        except NotFound:
            return None

    async def create_lease(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Conflict when another candidate created it first."""
        url_path = rest.resource(lease.API_VERSION, body["metadata"]["namespace"], lease.PLURAL)
        return _json(await self._send("POST", url_path, body=body, timeout=timeout))

    async def replace_lease(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """A PUT of the Lease read: Conflict when it changed since (its resourceVersion is in the body)."""
        meta = body["metadata"]
        url_path = rest.resource(lease.API_VERSION, meta["namespace"], lease.PLURAL, meta["name"])
        return _json(await self._send("PUT", url_path, body=body, timeout=timeout))

    def close(self) -> None:
        self.client.close()
