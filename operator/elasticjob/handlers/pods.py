"""Observe the pods and Services of every job through kopf indexes (watches, not LIST calls)."""

from __future__ import annotations

from typing import Any

import kopf

from elasticjob import naming
from elasticjob.observe import PodView, ServiceView, observe_pod, observe_service

OWNED = {naming.JOB_LABEL: kopf.PRESENT}


@kopf.index("pods", labels=OWNED)
def job_pods(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[tuple[str, str], PodView]:
    return {naming.job_key(namespace, labels[naming.JOB_LABEL]): observe_pod(body)}


@kopf.index("services", labels=OWNED)
def job_services(namespace: str, labels: kopf.Labels, body: kopf.Body,
                 **_: Any) -> dict[tuple[str, str], ServiceView]:
    return {naming.job_key(namespace, labels[naming.JOB_LABEL]): observe_service(body)}


@kopf.on.event("pods", labels=OWNED)
def pod_event(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.wake(naming.job_key(namespace, labels[naming.JOB_LABEL]))


@kopf.on.event("services", labels=OWNED)
def service_event(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.loops.wake(naming.job_key(namespace, labels[naming.JOB_LABEL]))
