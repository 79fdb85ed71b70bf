"""A reflector stopped while its watch request is on its way still ends at once.

The client is replaced by a stand-in whose watch request waits until the test lets it answer, and whose
stream then blocks until shut, as a real watch does until the server's timeout (minutes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from elasticjob.controller.reflector import Reflector, Source
from helpers import until

LOG = logging.getLogger("test")


class Stream:
    def __init__(self) -> None:
        self.shut = threading.Event()

    def __iter__(self):
        self.shut.wait(30)
        return iter(())

    def shutdown(self) -> None:
        self.shut.set()

    def release_conn(self) -> None:
        pass


class Client:
    """list and watch, as the kubernetes client answers them with _preload_content=False."""

    def __init__(self) -> None:
        self.requested, self.answer, self.stream = threading.Event(), threading.Event(), Stream()

    def __call__(self, **params):
        if not params.get("watch"):
            return SimpleNamespace(data=json.dumps({"items": [], "metadata": {"resourceVersion": "1"}}))
        self.requested.set()
        self.answer.wait(30)
        return self.stream


def test_a_watch_stopped_before_its_response_came_is_shut_when_it_comes():
    async def scenario():
        client, stopped = Client(), threading.Event()

        class Watched(Reflector):
            def stop(self) -> None:
                super().stop()
                stopped.set()

        executor = ThreadPoolExecutor(2)
        reflector = Watched(Source("Pod", None, None, client), lambda *_: None, lambda *_: None, executor, LOG)
        task = asyncio.create_task(reflector.run())
        await until(client.requested.is_set, 5, "the watch request sent")
        task.cancel()
        await until(stopped.is_set, 5, "the reflector stopped")  # with no response to shut
        client.answer.set()  # now the response arrives
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, "the reflector waited for its watch to time out"
        assert client.stream.shut.is_set()
        executor.shutdown(wait=False)
    asyncio.run(scenario())
