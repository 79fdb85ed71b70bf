"""Pure pod-status logic, as a kubelet computes it: container states -> phase, conditions and the status patch."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

CANNOT_LOCATE = "The container could not be located when the pod was terminated"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds_until(timestamp: str) -> float:
    """Time left to an API timestamp; a pod's deletionTimestamp is when its grace period ends."""
    when = dt.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


@dataclass
class ContainerRecord:
    name: str
    image: str
    init: bool = False
    restart_count: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    ready: bool = False

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else term["exitCode"]

    def status(self) -> dict:
        return {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": f"local://{self.name}-{self.restart_count}",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": "running" in self.state,
            "state": self.state,
            "lastState": self.last_state,
        }


def terminated(exit_code: int, started_at: str | None, message: str = "", reason: str | None = None) -> dict:
    if reason is None:
        reason = "Completed" if exit_code == 0 else "Error"
    term = {"exitCode": exit_code, "reason": reason, "startedAt": started_at, "finishedAt": now()}
    if exit_code > 128:
        term["signal"] = exit_code - 128
    if message:
        term["message"] = message
    return {"terminated": term}


def should_restart(restart_policy: str, exit_code: int) -> bool:
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def init_outcome(restart_policy: str, inits: list[ContainerRecord]) -> str:
    """'done', 'failed' (for good) or 'pending'."""
    for c in inits:
        code = c.exit_code
        if code == 0:
            continue
        if code is not None and restart_policy == "Never":
            return "failed"
        return "pending"
    return "done"


def pod_phase(restart_policy: str, inits: list[ContainerRecord], containers: list[ContainerRecord]) -> str:
    outcome = init_outcome(restart_policy, inits)
    if outcome == "failed":
        return "Failed"
    if outcome == "pending":
        return "Pending"
    running = fresh = failed = 0
    for c in containers:
        if "running" in c.state or ("waiting" in c.state and c.last_state):
            running += 1  # running, or waiting to restart
        elif "waiting" in c.state:
            fresh += 1
        elif c.exit_code != 0:
            failed += 1
    if fresh:
        return "Pending"
    if running or restart_policy == "Always":
        return "Running"
    if failed == 0:
        return "Succeeded"
    return "Failed" if restart_policy == "Never" else "Running"


def conditions(previous: list[dict], wanted: dict[str, tuple[bool, str]]) -> list[dict]:
    """Conditions with lastTransitionTime kept while a status does not change. wanted: type -> (status, reason)."""
    old = {c["type"]: c for c in previous}
    result = []
    for ctype, (ok, reason) in wanted.items():
        status = "True" if ok else "False"
        prev = old.get(ctype)
        since = prev["lastTransitionTime"] if prev and prev["status"] == status else now()
        cond = {"type": ctype, "status": status, "lastTransitionTime": since, "lastProbeTime": None}
        if reason:
            cond["reason"] = reason
        result.append(cond)
    return result


def wanted_conditions(phase: str, sandbox_ready: bool, inits_done: bool, containers: list[ContainerRecord]) -> dict:
    terminal = phase in ("Succeeded", "Failed")
    all_ready = bool(containers) and all(c.ready for c in containers) and not terminal
    not_ready = "PodCompleted" if terminal else ("" if all_ready else "ContainersNotReady")
    return {
        "PodReadyToStartContainers": (sandbox_ready and not terminal, ""),
        "Initialized": (inits_done, "" if inits_done else "ContainersNotInitialized"),
        "ContainersReady": (all_ready, not_ready),
        "Ready": (all_ready, not_ready),
        "PodScheduled": (True, ""),
    }


def status_patch(phase, pod_ip, host_ip, start_time, inits, containers, conds, message="", reason="") -> dict:
    status = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "conditions": conds,
        "initContainerStatuses": [c.status() for c in inits],
        "containerStatuses": [c.status() for c in containers],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if message:
        status["message"] = message
    if reason:
        status["reason"] = reason
    return {"status": status}


def recover(record: ContainerRecord, old: dict | None) -> None:
    """Rebuild a record from the API status after an agent restart: its process is gone, as after a node reboot."""
    if not old:
        return
    record.restart_count = old.get("restartCount", 0)
    record.last_state = old.get("lastState") or {}
    state = old.get("state") or {}
    if "running" in state:
        started = state["running"].get("startedAt")
        record.state = terminated(137, started, CANNOT_LOCATE, reason="ContainerStatusUnknown")
    elif "terminated" in state:
        record.state = state
