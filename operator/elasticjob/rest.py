"""Requests to the API server by path, through the official client's ApiClient.

The ApiClient brings what a client must get right: kubeconfig and in-cluster credentials, token refresh, TLS,
proxies, retries of reads. Its generated API classes are left out: constructing CoreV1Api imports a pydantic
model for every type of the core API and a validator for each of its methods, 21 MB resident, and with
the networking, scheduling and custom-object APIs 27 MB, a third of the operator's start (bench/fleet.py's
memory rows). The operator sends and reads JSON as dicts, so it needs none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import kubernetes
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# The generated client's keyword arguments of list and watch calls -> the API's query parameters.
QUERY_NAMES = {"label_selector": "labelSelector", "field_selector": "fieldSelector", "_continue": "continue",
               "resource_version": "resourceVersion", "allow_watch_bookmarks": "allowWatchBookmarks",
               "timeout_seconds": "timeoutSeconds", "limit": "limit", "watch": "watch"}

# Every request the operator sends, counted where all of them pass: the API server's own counters cannot tell
# one client from another, so this is the operator's share of its load (and what bench/fleet_scale.py divides
# by the jobs started). Served with the rest of metrics.py's series.
REQUESTS = Counter("elasticjob_api_requests_total", "Requests the operator sent to the API server, by verb and "
                   "resource (WATCH and LIST are GETs of a collection)", ["verb", "resource"])


def resource(api_version: str, namespace: str | None, plural: str, name: str | None = None,
             sub: str | None = None) -> str:
    """The path of a collection, an object or its subresource, each part quoted: the core API ("v1") under
    /api, the others under /apis. Without namespace: a cluster-scoped object, or a list across namespaces."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    head = ("namespaces", namespace) if namespace is not None else ()
    return "/".join([prefix, *(quote(part, safe="") for part in (*head, plural, name, sub) if part is not None)])


def call(client: kubernetes.client.ApiClient, method: str, url_path: str, *, query: dict[str, Any] | None = None,
         body: Any = None, content_type: str = JSON, timeout: Any = None, stream: bool = False) -> Any:
    """One request; the urllib3 response, read (`.data`), or with `stream` unread (iterate a watch's lines, then
    release_conn()). A status outside 2xx raises the client's ApiException, as its generated calls do.

    Read here, in the calling thread: an unread response keeps its connection out of the pool (the client asks
    urllib3 not to release it), so each request whose reply nobody read (a delete, an Event, an apply) made the
    next one open a new connection, a TLS handshake each: a quarter of the operator's CPU at 3,000 jobs."""
    REQUESTS.labels(*verb_and_resource(method, url_path, query)).inc()
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type
    pairs = [(key, value) for key, value in (query or {}).items() if value is not None]
    request = client.param_serialize(method=method, resource_path=url_path, query_params=pairs,
                                     header_params=headers, body=body, auth_settings=["BearerToken"])
    response = client.call_api(*request, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    if not stream:
        response.response.data  # noqa: B018  # read to the end: urllib3 then puts the connection back
    return response.response


def verb_and_resource(method: str, url_path: str, query: dict[str, Any] | None) -> tuple[str, str]:
    """A request's verb as the API server counts it, and its resource ("pods", "elasticjobs/status")."""
    parts = url_path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # past /api/v1 or /apis/<group>/<version>
    if len(parts) > 2 and parts[0] == "namespaces":
        parts = parts[2:]  # a namespaced path; /api/v1/namespaces/<name> alone is a namespace
    resource = "/".join(parts[:1] + parts[2:3])
    if method != "GET" or len(parts) != 1:
        return method, resource
    return ("WATCH" if (query or {}).get("watch") else "LIST"), resource


def lister(client: kubernetes.client.ApiClient, url_path: str) -> Callable[..., Any]:
    """A list-and-watch call for the reflector, taking the generated client's keyword arguments."""

    def list_or_watch(_preload_content: bool = False, _request_timeout: Any = None, **params: Any) -> Any:
        query = {QUERY_NAMES[key]: value for key, value in params.items()}
        return call(client, "GET", url_path, query=query, timeout=_request_timeout, stream=bool(params.get("watch")))

    return list_or_watch
