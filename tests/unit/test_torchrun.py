"""The agent's PET_* environment: one pure function, a table of cases."""

from __future__ import annotations

import pytest
from factory import spec, template

from elasticjob import torchrun


def env_of(s, container=None, budget=3):
    container = container or template()["spec"]["containers"][0]
    items = torchrun.agent_env(job_name="train", run_id="uid-1", spec=s, container=container,
                               endpoint="10.96.0.42:29400", restart_budget=budget)
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in items}


@pytest.mark.parametrize("fields, key, value", [
    ({"minReplicas": 1, "maxReplicas": 3}, "PET_NNODES", "1:3"),
    ({"minReplicas": 2, "maxReplicas": 2, "replicas": 2}, "PET_NNODES", "2:2"),
    ({}, "PET_RDZV_BACKEND", "c10d"),
    ({}, "PET_RDZV_ENDPOINT", "10.96.0.42:29400"),
    ({}, "PET_RDZV_ID", "uid-1"),
    ({}, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),
    ({"nprocPerNode": 4}, "PET_NPROC_PER_NODE", "4"),
    ({"nprocPerNode": "auto"}, "PET_NPROC_PER_NODE", "1"),
    ({"checkpointDir": "/ckpt"}, "ELASTICJOB_CHECKPOINT_DIR", "/ckpt"),
    ({"watchdog": {"enabled": True, "stepTimeoutSeconds": 90}}, "TORCHELASTIC_ENABLE_FILE_TIMER", "1"),
    ({"watchdog": {"enabled": True, "stepTimeoutSeconds": 90}}, "ELASTICJOB_STEP_TIMEOUT_SECONDS", "90"),
])
def test_agent_env(fields, key, value):
    assert env_of(spec(**fields))[key] == value


def test_rendezvous_conf_is_external_and_uses_measured_timeouts():
    conf = dict(pair.split("=") for pair in env_of(spec())["PET_RDZV_CONF"].split(","))
    assert conf == {"is_host": "false", "join_timeout": "600", "last_call_timeout": "2", "close_timeout": "10",
                    "keep_alive_interval": "1", "keep_alive_max_attempt": "5", "read_timeout": "60"}


def test_local_addr_is_the_pod_ip():
    assert env_of(spec())["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_restart_budget_is_passed_to_the_agent():
    assert env_of(spec(), budget=1)["PET_MAX_RESTARTS"] == "1"


def test_watchdog_off_by_default():
    assert "TORCHELASTIC_ENABLE_FILE_TIMER" not in env_of(spec())


@pytest.mark.parametrize("resources, nproc", [
    ({"limits": {"nvidia.com/gpu": 8}}, 8),
    ({"requests": {"nvidia.com/gpu": "2"}}, 2),
    ({"limits": {"amd.com/gpu": 4}}, 4),
    ({"limits": {"cpu": 4}}, 1),
])
def test_auto_nproc_follows_requested_gpus(resources, nproc):
    container = template(resources=resources)["spec"]["containers"][0]
    assert torchrun.nproc_per_node(spec(nprocPerNode="auto"), container) == nproc


def test_reserved_names_cover_every_variable_the_operator_sets():
    assert set(env_of(spec(checkpointDir="/c", watchdog={"enabled": True}))) - {"POD_IP", "POD_NAME"} \
        <= torchrun.RESERVED_ENV


@pytest.mark.parametrize("run_policy, grace", [({}, "30"), ({"stopGraceSeconds": 90}, "90"),
                                               ({"stopGraceSeconds": 0}, "0")])
def test_the_agent_learns_the_stop_grace(run_policy, grace):
    assert env_of(spec(runPolicy=run_policy))["ELASTICJOB_STOP_GRACE_SECONDS"] == grace
