"""Is Kueue here? Read at start, then re-read every minute; a change restarts the operator.

Discovery rather than a watch on CustomResourceDefinitions: every authenticated user may read it, so no
install (a namespace-scoped one included) needs a cluster-wide grant over every CRD. The watches are chosen once
at start and all list before any job's loop runs (controller/watch.py); when Kueue appears or goes, the operator
stops (SIGTERM to itself, kopf's graceful stop) and its Deployment starts it again on the same path, now with
or without Kueue's watches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal

from elasticjob import backoff, k8s, kueue
from elasticjob.controller.context import Context

RECHECK_SECONDS = 60.0


async def served(ctx: Context) -> bool | None:
    """None: the API server could not say (the last answer stands)."""
    try:
        return await ctx.kube.served(kueue.API_VERSION, kueue.WORKLOADS)
    except k8s.KubeError as exc:
        ctx.logger.warning(f"could not read whether Kueue's API is served: {exc}")
        return None


async def resolve(ctx: Context) -> None:
    """kueue auto: on exactly when Kueue's Workloads are served; on and off are taken as said."""
    mode = ctx.settings.kueue_mode
    if mode == "auto":
        here = await served(ctx)
        while here is None:
            # A definite answer first: taking "no answer" for "no Kueue" would hold, and stop, every running
            # queue-labelled job until the next check.
            await asyncio.sleep(backoff.KUEUE_DISCOVERY)
            here = await served(ctx)
        ctx.settings = dataclasses.replace(ctx.settings, kueue=here)
        said = "served: queue-labelled jobs wait for its admission" if here else \
            "not served: queue-labelled jobs hold until it is"
        ctx.logger.info(f"Kueue's API ({kueue.API_VERSION} workloads) is {said}")
    else:
        ctx.settings = dataclasses.replace(ctx.settings, kueue=mode == "on")
        ctx.logger.info(f"Kueue is {mode} (--kueue {mode})")


async def follow(ctx: Context) -> None:
    """kueue auto only: restart when Kueue's API appears or goes."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        here = await served(ctx)
        if here is not None and here != ctx.settings.kueue:
            ctx.logger.warning(f"Kueue's API {'appeared' if here else 'went'}: restarting the operator to "
                               f"{'watch' if here else 'stop watching'} Workloads")
            os.kill(os.getpid(), signal.SIGTERM)
            return
