"""Watch gaps against a real API server: what was deleted while no watch ran leaves the operator's mirror.

An API server restart empties its watch cache; a watch resumed from the version before it gets 410 Gone,
and the list that follows must replace the mirror. kopf's indexes kept such objects for ever: a replica slot
never refilled, a phantom ready store, the loop of a deleted job running on.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import pytest
from jobapi import GROUP, PLURAL, ROOT, VERSION, create, job_manifest
from kubernetes import client

from elasticjob.controller import reflector
from elasticjob.controller.mirror import Mirror
from helpers import until, wait_for

# Never beside other tests (make test runs these after the tier's parallel part):
# it restarts the API server.
pytestmark = pytest.mark.alone

LOG = logging.getLogger("test")


def labelled_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"elasticjob.dev/job-name": "gap"}},
            "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "x"}]}}


def test_a_resumed_watch_after_an_api_server_restart_lists_again_and_drops_the_deleted(
        kube, api, namespace, crds_installed, cluster):
    if cluster.kind != "local":
        pytest.skip("restarts the local cluster's API server")
    from localcluster import restarts

    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    for name in ("gap-worker-0", "gap-worker-1"):
        core.create_namespaced_pod(namespace, labelled_pod(name))
    create(api, namespace, job_manifest("gap"))
    mirror, woken = Mirror(), []

    def sink(kind):
        store = mirror.cache(kind)
        return (lambda ns, items: woken.extend(store.replace(ns, items)),
                lambda event, body: woken.extend(store.apply(event, body)))

    sources = [reflector.Source("pods", namespace, "elasticjob.dev/job-name",
                                functools.partial(core.list_namespaced_pod, namespace)),
               reflector.Source("elasticjobs", namespace, None, functools.partial(
                   custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL))]
    threads = reflector.watch_threads(len(sources))
    reflectors = [reflector.Reflector(s, *sink(s.kind), threads, LOG) for s in sources]

    async def scenario():
        tasks = [asyncio.create_task(r.run()) for r in reflectors]
        await until(lambda: len(mirror.pods) == 2 and len(mirror.jobs) == 1, 30, "the first list", interval=0.1)
        # The operator stops watching (frozen, partitioned); meanwhile a pod and the job are deleted,
        # and the API server restarts, forgetting the versions the watches would resume from.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(core.delete_namespaced_pod, "gap-worker-1", namespace, grace_period_seconds=0)
        await asyncio.to_thread(custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, "gap")
        await asyncio.to_thread(restarts.restart, ROOT, "apiserver", 0.0, LOG.info)
        lists_before = [r.lists for r in reflectors]
        woken.clear()
        tasks = [asyncio.create_task(r.run()) for r in reflectors]
        try:
            await until(lambda: all(r.lists > n for r, n in zip(reflectors, lists_before)), 60, "a new list",
                        interval=0.1)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    threads.shutdown(wait=False)
    assert [p.name for p in mirror.pods.of((namespace, "gap"))] == ["gap-worker-0"]
    assert mirror.job((namespace, "gap")) is None
    assert (namespace, "gap") in woken, "the job whose pod vanished is woken"
    wait_for(lambda: core.list_namespaced_pod(namespace).items, 30, "API server serving again", until=bool)
