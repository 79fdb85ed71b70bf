"""The torchrun agent's configuration, as the PET_* environment torch.distributed.run reads. Pure."""

from __future__ import annotations

from typing import Any

from elasticjob.models import ElasticJobSpec

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
# An agent is stale once its heartbeat is this many keep-alive intervals old: one missed keep-alive
# (measured: waiting for it cost 0.25 s at the median, and it keeps a slow agent from being taken for dead).
# Half an interval of slack: at the 1 s default, a heartbeat up to 0.5 s late on a loaded node is not missed.
STALE_FACTOR = 1.5

# Set by the operator or by the agent itself; a user value would silently fight ours.
RESERVED_ENV = frozenset({
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID",
    "PET_RDZV_CONF", "PET_MAX_RESTARTS", "PET_LOCAL_ADDR", "PET_STANDALONE", "PET_NODE_RANK",
    "PET_MASTER_ADDR", "PET_MASTER_PORT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "TORCHELASTIC_ENABLE_FILE_TIMER", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "ELASTICJOB_NAME", "ELASTICJOB_CHECKPOINT_DIR",
    "ELASTICJOB_STEP_TIMEOUT_SECONDS", "ELASTICJOB_STOP_GRACE_SECONDS", "ELASTICJOB_NODE_CHECK",
    "ELASTICJOB_LINK_PROBE", "ELASTICJOB_LINK_PROBE_FACTOR",
    "ELASTICJOB_NODE_CHECK_SECONDS", "ELASTICJOB_SEATS",
})


def requested_gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        for name in GPU_RESOURCES:
            value = (resources.get(section) or {}).get(name)
            if value is not None:
                return int(str(value))
    return 0


def nproc_per_node(spec: ElasticJobSpec, container: dict[str, Any]) -> int:
    if spec.nproc_per_node == "auto":
        return requested_gpus(container) or 1
    return int(spec.nproc_per_node)


def rdzv_conf(spec: ElasticJobSpec) -> str:
    r = spec.rendezvous
    # is_host=false: the store lives in the rendezvous pod, so losing any worker (rank 0 too) spares the job.
    pairs = {
        "is_host": "false",
        "join_timeout": r.join_timeout_seconds,
        "last_call_timeout": r.last_call_timeout_seconds,
        "close_timeout": r.close_timeout_seconds,
        "keep_alive_interval": r.keep_alive_interval_seconds,
        "keep_alive_max_attempt": r.keep_alive_max_attempts,
        "read_timeout": r.read_timeout_seconds,
    }
    return ",".join(f"{key}={value}" for key, value in pairs.items())


def agent_env(*, job_name: str, run_id: str, spec: ElasticJobSpec, container: dict[str, Any],
              endpoint: str, restart_budget: int) -> list[dict[str, Any]]:
    """Environment of the worker container: torchrun reads every flag from PET_<FLAG>."""
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "PET_NNODES", "value": f"{spec.min_replicas}:{spec.max_replicas}"},
        {"name": "PET_NPROC_PER_NODE", "value": str(nproc_per_node(spec, container))},
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_RDZV_ENDPOINT", "value": endpoint},
        {"name": "PET_RDZV_ID", "value": run_id},
        {"name": "PET_RDZV_CONF", "value": rdzv_conf(spec)},
        {"name": "PET_MAX_RESTARTS", "value": str(restart_budget)},
        # Agents in separate PID namespaces all have pid 1; the pod IP keeps their node identities apart.
        {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # With torch's default a node joining a running job waits forever for a MASTER_ADDR key.
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        {"name": "ELASTICJOB_NAME", "value": job_name},
        # How long the agent lets the training save at an agreed step on SIGTERM (an eviction, a node drain)
        # before torchrun stops the workers (elasticjob_warm/evicted.py); 0: at once, as torchrun does.
        {"name": "ELASTICJOB_STOP_GRACE_SECONDS", "value": str(spec.run_policy.stop_grace_seconds)},
        # The kit's check of the node before the agent joins (elasticjob_warm/nodecheck.py); plain torchrun
        # ignores both.
        {"name": "ELASTICJOB_NODE_CHECK", "value": "1" if spec.node_check.enabled else "0"},
        {"name": "ELASTICJOB_NODE_CHECK_SECONDS", "value": str(spec.node_check.timeout_seconds)},
        # The link probe among a round's agents once it forms (elasticjob_warm/linkprobe.py).
        {"name": "ELASTICJOB_LINK_PROBE", "value": "1" if spec.node_check.link_probe else "0"},
        {"name": "ELASTICJOB_LINK_PROBE_FACTOR", "value": f"{spec.node_check.link_factor:g}"},
    ]
    if spec.spares:  # a spare's agent waits for a seat before it joins (elasticjob_warm/seat.py)
        env.append({"name": "ELASTICJOB_SEATS", "value": "1"})
    if spec.checkpoint_dir:
        env.append({"name": "ELASTICJOB_CHECKPOINT_DIR", "value": spec.checkpoint_dir})
    if spec.watchdog.enabled:
        env.append({"name": "TORCHELASTIC_ENABLE_FILE_TIMER", "value": "1"})
        env.append({"name": "ELASTICJOB_STEP_TIMEOUT_SECONDS", "value": str(spec.watchdog.step_timeout_seconds)})
    return env
