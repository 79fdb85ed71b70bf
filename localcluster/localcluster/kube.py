"""Thin helpers over the official client: plain dicts in and out, strategic-merge patches, list+watch loops."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)
STRATEGIC = "application/strategic-merge-patch+json"


def api_client(kubeconfig: str) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = 32  # one connection per watch and per pod runner thread at worst
    return client.ApiClient(cfg)


def as_dict(response) -> dict:
    return json.loads(response.data)


def get_or_none(call: Callable, *args, **kwargs) -> dict | None:
    try:
        return as_dict(call(*args, _preload_content=False, **kwargs))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def ignore_missing(call: Callable, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status not in (404, 409):
            raise


def watch_forever(list_call: Callable, on_event: Callable[[str, dict], None], on_list: Callable[[list[dict]], None],
                  stop: threading.Event, **kwargs) -> None:
    """List, hand the items to on_list, then watch from that resourceVersion; relist on expiry or error."""
    while not stop.is_set():
        try:
            listed = as_dict(list_call(_preload_content=False, **kwargs))
            on_list(listed.get("items", []))
            rv = listed["metadata"]["resourceVersion"]
            while not stop.is_set():
                w = watch.Watch()
                for event in w.stream(list_call, resource_version=rv, timeout_seconds=30,
                                      allow_watch_bookmarks=True, **kwargs):
                    obj = event["raw_object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event["type"] == "ERROR":
                        raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                    if event["type"] != "BOOKMARK":
                        on_event(event["type"], obj)
                    if stop.is_set():
                        w.stop()
        except Exception as exc:  # noqa: BLE001 - a watch must survive apiserver restarts and 410s
            if not stop.is_set():
                log.info("watch %s restarting: %s", getattr(list_call, "__name__", list_call), exc)
                stop.wait(1)
