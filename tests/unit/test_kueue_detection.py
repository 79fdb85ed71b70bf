"""Whether Kueue is here, at the operator's start: an API server that cannot say is asked again, never taken
for "no Kueue" (that would hold, and stop, every running queue-labelled job)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from elasticjob import backoff, k8s
from elasticjob.kueue import discovery as kueue_discovery


class Discovery:
    """The client's discovery call: answers in turn, an exception raised."""

    def __init__(self, *answers: bool | Exception):
        self.answers, self.asked = list(answers), 0

    async def served(self, api_version: str, plural: str) -> bool:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def resolve(discovery: Discovery, mode: str = "auto") -> bool:
    return asyncio.run(kueue_discovery.resolve(discovery, mode, logging.getLogger("test")))


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backoff, "KUEUE_DISCOVERY", 0)


@pytest.mark.parametrize("answers, expected", [
    ((True,), True),
    ((False,), False),
    ((k8s.KubeError(503, "ServiceUnavailable", "try later"), True), True),
    ((k8s.KubeError(500, "InternalError", "etcd"), k8s.KubeError(503, "x", "y"), False), False),
])
def test_auto_waits_for_a_definite_answer(answers: tuple, expected: bool) -> None:
    discovery = Discovery(*answers)
    assert resolve(discovery) is expected
    assert discovery.asked == len(answers)


@pytest.mark.parametrize("mode, expected", [("on", True), ("off", False)])
def test_on_and_off_ask_nothing(mode: str, expected: bool) -> None:
    discovery = Discovery()
    assert resolve(discovery, mode) is expected
    assert discovery.asked == 0
