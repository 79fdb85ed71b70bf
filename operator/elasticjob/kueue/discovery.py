"""Is Kueue here? Read at start, then re-read every minute; a change restarts the operator.

Discovery rather than a watch on CustomResourceDefinitions: every authenticated user may read it, so no
install (a namespace-scoped one included) needs a cluster-wide grant over every CRD. The watches are chosen once
at start and all list before any job's loop runs (controller/watch.py); when Kueue appears or goes, the operator
stops (SIGTERM to itself, kopf's graceful stop) and its Deployment starts it again on the same path, now with
or without Kueue's watches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from elasticjob import backoff, k8s
from elasticjob.kueue import workloads

RECHECK_SECONDS = 60.0


async def served(kube: k8s.Kube, logger: logging.Logger) -> bool | None:
    """None: the API server could not say (the last answer stands)."""
    try:
        return await kube.served(workloads.API_VERSION, workloads.WORKLOADS)
    except k8s.KubeError as exc:
        logger.warning(f"could not read whether Kueue's API is served: {exc}")
        return None


async def resolve(kube: k8s.Kube, mode: str, logger: logging.Logger) -> bool:
    """Whether Kueue is on. auto: exactly when Kueue's Workloads are served; on and off are taken as said."""
    if mode != "auto":
        logger.info(f"Kueue is {mode} (--kueue {mode})")
        return mode == "on"
    here = await served(kube, logger)
    while here is None:
        # A definite answer first: taking "no answer" for "no Kueue" would hold, and stop, every running
        # queue-labelled job until the next check.
        await asyncio.sleep(backoff.KUEUE_DISCOVERY)
        here = await served(kube, logger)
    said = "served: queue-labelled jobs wait for its admission" if here else \
        "not served: queue-labelled jobs hold until it is"
    logger.info(f"Kueue's API ({workloads.API_VERSION} workloads) is {said}")
    return here


async def follow(kube: k8s.Kube, here: bool, logger: logging.Logger) -> None:
    """kueue auto only: restart when Kueue's API appears or goes."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        now = await served(kube, logger)
        if now is not None and now != here:
            logger.warning(f"Kueue's API {'appeared' if now else 'went'}: restarting the operator to "
                           f"{'watch' if now else 'stop watching'} Workloads")
            os.kill(os.getpid(), signal.SIGTERM)
            return
