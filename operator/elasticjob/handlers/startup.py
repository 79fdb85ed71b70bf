"""All process-wide settings in one place, and the clients kept in memo."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from elasticjob import k8s
from elasticjob.models import GROUP
from elasticjob.loops import JobLoops

API_THREADS = 32


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    # Annotations, not status: the CRD's structural schema would prune kopf's status fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "elasticjob-operator"  # the "From" of `kubectl describe ej`
    # Reconnect watches every few minutes, so a silently broken connection cannot stall the operator.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10]
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(API_THREADS, "kube-api"))
    memo.kube = k8s.Kube(k8s.api_client())
    memo.loops = JobLoops()
    logger.info("elasticjob operator started")


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "loops", None) is not None:
        await memo.loops.stop_all()
    if getattr(memo, "kube", None) is not None:
        memo.kube.close()
