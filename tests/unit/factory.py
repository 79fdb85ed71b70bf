"""Jobs and observed pods as plain data, for the planner's table tests."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from elasticjob import naming, planner
from elasticjob.domain import JobRef, Settings
from elasticjob.gang.planning import Gang
from elasticjob.kueue import settings as kueue_settings
from elasticjob.kueue.admission import Kueue
from elasticjob.models import ElasticJobSpec, ElasticJobStatus
from elasticjob.observe import PodView, ServiceView, StoreNode, StoreView

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "0b7c6a52-1111-2222-3333-444455556666"
SERVICE = ServiceView(name="train-rdzv", cluster_ip="10.96.0.42", uid="uid-s", owner_uid=UID)


def template(**container: Any) -> dict[str, Any]:
    base = {"name": "worker", "image": "trainer:1", "command": ["torchrun", "train.py"]}
    return {"spec": {"containers": [{**base, **container}]}}


def spec(**fields: Any) -> ElasticJobSpec:
    data = {"minReplicas": 1, "maxReplicas": 3, "replicas": 2, "maxRestarts": 3, "template": template()}
    return ElasticJobSpec.model_validate({**data, **fields})


def job(status: dict[str, Any] | None = None, generation: int = 1, labels: dict[str, str] | None = None,
        **fields: Any) -> planner.Job:
    ref = JobRef(namespace="ml", name="train", uid=UID, spec=spec(**fields), labels=tuple(sorted((labels or {}).items())))
    return planner.Job(ref=ref, generation=generation, status=ElasticJobStatus.model_validate(status or {}))


def running_status(**extra: Any) -> dict[str, Any]:
    base = {"phase": "Running", "reason": "Running", "startTime": "2026-01-01T11:00:00Z",
            "rendezvous": {"ready": True, "endpoint": "10.96.0.42:29400"},
            # The store has served since the start (recovery.py's STORE_SETTLE is long over).
            "conditions": [{"type": "RendezvousReady", "status": "True", "reason": "StoreReady",
                            "lastTransitionTime": "2026-01-01T11:00:00Z"}]}
    return {**base, **extra}


def worker(index: int, phase: str = "Running", **fields: Any) -> PodView:
    defaults = dict(name=naming.worker_pod_name("train", index), uid=f"uid-w{index}", role=naming.ROLE_WORKER,
                    index=index, phase=phase, ready=phase == "Running", node="node-a", owner_uid=UID,
                    ip=f"10.244.0.{10 + index}", started=phase != "Pending")
    # The kubelet's container readiness follows the pod's Ready condition unless a test sets them apart.
    defaults["containers_ready"] = fields.get("ready", defaults["ready"])
    return PodView(**{**defaults, **fields})


def failed(index: int, exit_code: int = 1, ago: float = 1.0, **fields: Any) -> PodView:
    return worker(index, "Failed", exit_code=exit_code, worker_exit_code=fields.pop("worker_exit_code", exit_code),
                  reason=fields.pop("reason", "Error"), finished_at=NOW - timedelta(seconds=ago), **fields)


def rdzv(ready: bool = True, phase: str = "Running", **fields: Any) -> PodView:
    return PodView(**{**dict(name="train-rdzv", uid="uid-r", role=naming.ROLE_RENDEZVOUS, index=None,
                             phase=phase, ready=ready, owner_uid=UID, started=True, ip="10.244.0.5"), **fields})


def store(epoch: str = "e1", round: int = 1, failure_rounds: int = 0, nodes: int = 2, **fields: Any) -> StoreView:
    participants = tuple(StoreNode(f"10.244.0.{10 + i}", 0.5) for i in range(nodes))
    return StoreView(**{"epoch": epoch, "round": round, "complete": True, "participants": participants,
                        "failure_rounds": failure_rounds, **fields})


def observed(pods: list[PodView], service: ServiceView | None = SERVICE, **fields: Any) -> planner.Observed:
    """Every integration is there, as the controller observes them: the gang's `pod_group`, Kueue's `workloads`,
    `flavors` and `priority`; `workload=W` is the one Workload of the job."""
    if "workload" in fields:
        workload = fields.pop("workload")
        fields["workloads"] = (workload,) if workload is not None else ()
    gang = Gang(fields.pop("pod_group", None))
    kueue = Kueue(fields.pop("workloads", ()), fields.pop("flavors", {}), fields.pop("priority", None))
    return planner.Observed(pods=pods, service=service, integrations=(gang, kueue), **fields)


def creates(result: planner.Plan, kind: str = "Pod") -> list[str]:
    return sorted(a.manifest["metadata"]["name"] for a in result.actions
                  if isinstance(a, planner.CreateObject) and a.manifest["kind"] == kind)


def deletes(result: planner.Plan) -> list[tuple[str, int | None]]:
    return sorted((a.name, a.grace_seconds) for a in result.actions if isinstance(a, planner.DeletePod))


def condition(result: planner.Plan, kind: str) -> str | None:
    return next((c.status for c in result.status.conditions if c.type == kind), None)


def with_kueue(base: Settings | None = None, **fields: Any) -> Settings:
    """`base` (default: the defaults) with these Kueue settings: with_kueue(on=True, slices=False)."""
    base = base or Settings()
    return kueue_settings.with_kueue(base, dataclasses.replace(kueue_settings.of(base), **fields))
