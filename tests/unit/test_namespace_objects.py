"""Objects a namespace's jobs share (handlers.context.NamespaceObjects): one create however many ask at once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from elasticjob import k8s
from elasticjob.controller.context import NamespaceObjects

POLICY = {"kind": "NetworkPolicy", "metadata": {"name": "elasticjob-rendezvous", "namespace": "ml"}}


class Server:
    """Counts creates; answers each after the test lets it go, as an API server would (201, then 409)."""

    def __init__(self, refuse: int = 0) -> None:
        self.calls = 0
        self.refuse = refuse
        self.release = asyncio.Event()

    async def create(self, manifest: dict) -> dict | None:
        self.calls += 1
        await self.release.wait()
        if self.calls <= self.refuse:
            raise k8s.Forbidden(403, "Forbidden", "exceeded quota")
        return manifest if self.calls == self.refuse + 1 else None


def test_reconciles_asking_at_once_share_one_create():
    async def scenario():
        objects, server = NamespaceObjects(), Server()
        asking = [asyncio.create_task(objects.create(POLICY, server.create)) for _ in range(10)]
        await asyncio.sleep(0)
        server.release.set()
        results = await asyncio.gather(*asking)
        assert server.calls == 1 and results.count(POLICY) == 1 and results.count(None) == 9
        assert await objects.create(POLICY, server.create) is None and server.calls == 1
        objects.forget("ml")  # the namespace's last job left: the next job creates it again (409 if still there)
        await objects.create(POLICY, server.create)
        assert server.calls == 2
    asyncio.run(scenario())


def test_a_refused_create_is_tried_again_by_the_next_job():
    async def scenario():
        objects, server = NamespaceObjects(), Server(refuse=1)
        server.release.set()
        with pytest.raises(k8s.Forbidden):
            await objects.create(POLICY, server.create)
        assert await objects.create(POLICY, server.create) == POLICY and server.calls == 2
    asyncio.run(scenario())


def test_a_cancelled_reconcile_does_not_cancel_the_shared_create():
    async def scenario():
        objects, server = NamespaceObjects(), Server()
        first = asyncio.create_task(objects.create(POLICY, server.create))
        await asyncio.sleep(0)
        first.cancel()  # its job was deleted meanwhile
        second = asyncio.create_task(objects.create(POLICY, server.create))
        await asyncio.sleep(0)
        server.release.set()
        assert await second is None and server.calls == 1
    asyncio.run(scenario())


def test_a_create_after_the_last_job_left_waits_for_the_deletion():
    """Deleted before created again, never after: a new job's store is not left outside its policy."""
    async def scenario():
        objects, server, order = NamespaceObjects(), Server(), []
        server.release.set()
        await objects.create(POLICY, server.create)
        deleting = asyncio.Event()

        async def delete(namespace: str) -> None:
            await deleting.wait()
            order.append(f"deleted {namespace}")

        async def create(manifest: dict) -> dict | None:
            order.append("created")
            return manifest

        objects.retire("ml", delete)
        creating = asyncio.create_task(objects.create(POLICY, create))
        await asyncio.sleep(0)
        deleting.set()
        assert await creating == POLICY and order == ["deleted ml", "created"]
    asyncio.run(scenario())


def test_a_failed_deletion_does_not_stop_the_next_create():
    async def scenario():
        objects = NamespaceObjects()

        async def delete(namespace: str) -> None:
            raise k8s.Unavailable(0, "Unavailable", "no answer")

        async def create(manifest: dict) -> dict | None:
            return manifest

        objects.retire("ml", delete)
        assert await objects.create(POLICY, create) == POLICY
    asyncio.run(scenario())


def test_a_policy_deleted_by_someone_is_created_again_by_a_reconcile_after_the_recheck():
    async def scenario():
        now = [0.0]
        objects, server = NamespaceObjects(clock=lambda: now[0]), Server()
        server.release.set()
        assert await objects.create(POLICY, server.create) == POLICY
        now[0] = NamespaceObjects.RECHECK - 1
        assert await objects.create(POLICY, server.create) is None and server.calls == 1  # within: no request
        now[0] = NamespaceObjects.RECHECK
        await objects.create(POLICY, server.create)
        assert server.calls == 2  # asked again: made anew where someone deleted it, a 409 where it stands
    asyncio.run(scenario())


def test_the_policies_go_only_once_the_jobs_pods_are_gone_and_stay_when_a_job_comes_back(monkeypatch):
    from elasticjob.controller import namespace_cleanup

    class Kube:
        def __init__(self) -> None:
            self.deleted: list[str] = []

        async def get_object(self, *_args):
            labels = dict(namespace_cleanup.builders.MANAGED_BY)
            return {"metadata": {"labels": labels, "uid": "u", "resourceVersion": "1"}}

        async def delete_object(self, _api, _plural, _namespace, name, *_args):
            self.deleted.append(name)
            return True

    async def scenario(jobs_back: bool) -> list[str]:
        kube, pods = Kube(), {"left": True}
        task = asyncio.create_task(namespace_cleanup.delete_policies(
            kube, "ml", logging.getLogger("test"), pods_left=lambda: pods["left"], jobs_back=lambda: jobs_back))
        for _ in range(5):
            await asyncio.sleep(0.01)
        assert kube.deleted == [] or jobs_back
        pods["left"] = False
        await asyncio.wait_for(task, 5)
        return kube.deleted

    monkeypatch.setattr(namespace_cleanup, "LOOK_EVERY", 0.01)
    assert asyncio.run(scenario(False)) == list(namespace_cleanup.POLICIES)
    assert asyncio.run(scenario(True)) == []
