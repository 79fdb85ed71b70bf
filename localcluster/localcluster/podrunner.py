"""One pod's lifecycle on a local node, driven by one thread: sandbox, init containers, containers, restarts,
readiness, status written back, graceful deletion. The agent only feeds it the latest pod object."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import containers, images, kube, launcher, network, podevents, podstatus, probes, state, volumes
from .podstatus import ContainerRecord

log = logging.getLogger(__name__)
TICK = 0.2
MAX_BACKOFF = 10.0


@dataclass
class NodeContext:
    core: client.CoreV1Api
    state_dir: Path
    ipam: network.Ipam
    repo_root: Path
    host_ip: str
    allocatable: dict
    is_lost: Callable[[str], bool]


class PodRunner:
    def __init__(self, ctx: NodeContext, pod: dict):
        meta = pod["metadata"]
        self.ctx, self.pod = ctx, pod
        self.namespace, self.name_only = meta["namespace"], meta["name"]
        self.name = f"{self.namespace}/{self.name_only}"
        self.uid, self.node = meta["uid"], pod["spec"]["nodeName"]
        self.path = state.pod_dir(ctx.state_dir, meta["namespace"], meta["name"], self.uid)
        self.wake = threading.Event()
        self.vanished = False
        self.sandbox: launcher.Sandbox | None = None
        self.procs: dict[str, launcher.ContainerProcess] = {}
        self.readiness: dict[str, probes.Readiness] = {}
        self.liveness: dict[str, probes.Liveness] = {}
        self.killing: dict[str, float] = {}  # container -> when SIGKILL follows the SIGTERM of a failed liveness
        self.not_before: dict[str, float] = {}
        self.envs: dict[str, dict] = {}
        self.volumes: dict[str, str] | None = None
        self.sent: dict | None = None
        self.lookup = volumes.object_lookup(ctx.core)
        self.start_time = (pod.get("status") or {}).get("startTime")
        status = pod.get("status") or {}
        old = {c["name"]: c for key in ("initContainerStatuses", "containerStatuses") for c in status.get(key) or []}
        init_specs, main_specs = pod["spec"].get("initContainers") or [], pod["spec"]["containers"]
        self.inits = [ContainerRecord(c["name"], c.get("image", ""), init=True) for c in init_specs]
        self.mains = [ContainerRecord(c["name"], c.get("image", "")) for c in main_specs]
        self.specs = {c["name"]: c for c in init_specs + main_specs}
        live = status.get("phase") not in ("Succeeded", "Failed")
        adopted = self.adopt(old) if live else set()
        for rec in self.inits + self.mains:
            if rec.name not in adopted:
                launcher.signal_container(state.pid_file(self.path, rec.name), signal.SIGKILL)  # no half-adoptions
                podstatus.recover(rec, old.get(rec.name))
                if rec.exit_code is not None and live:
                    self.schedule_restart(rec)  # found dead after an agent restart

    def adopt(self, old: dict) -> set[str]:
        """Take over the sandbox and live containers an earlier agent left; returns the adopted containers."""
        record = state.read_json(state.runtime_file(self.path), None)
        if not record or (record.get("netns") and not Path(f"/run/netns/{record['netns']}").exists()):
            return set()
        self.sandbox = launcher.Sandbox(self.path, record.get("netns"), record["ip"])
        adopted = set()
        for rec in self.inits + self.mains:
            proc = launcher.adopt(self.path, rec.name)
            if proc is None:
                continue
            prev = old.get(rec.name) or {}
            rec.restart_count, rec.last_state = prev.get("restartCount", 0), prev.get("lastState") or {}
            started = ((prev.get("state") or {}).get("running") or {}).get("startedAt") or podstatus.now()
            rec.state = {"running": {"startedAt": started}}
            self.procs[rec.name] = proc
            self.envs[rec.name] = state.read_json(self.path / f"{rec.name}.spec.json", {}).get("env", {})
            readiness = probes.Readiness(None if rec.init else self.specs[rec.name].get("readinessProbe"))
            readiness.ready = rec.ready = bool(prev.get("ready")) or readiness.ready
            self.readiness[rec.name] = readiness
            self.liveness[rec.name] = probes.Liveness(None if rec.init else self.specs[rec.name].get("livenessProbe"))
            adopted.add(rec.name)
        return adopted

    # --- called from the agent's watch thread -------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=self.run, name=f"pod-{self.name}", daemon=True).start()

    def update(self, pod: dict) -> None:
        self.pod = pod
        self.wake.set()

    def gone(self) -> None:
        self.vanished = True
        self.wake.set()

    # --- the pod's own thread ------------------------------------------------------------------------------
    @property
    def policy(self) -> str:
        return self.pod["spec"].get("restartPolicy", "Always")

    @property
    def phase(self) -> str:
        return podstatus.pod_phase(self.policy, self.inits, self.mains)

    def run(self) -> None:
        while True:
            try:
                if self.iterate():
                    return
            except Exception:  # noqa: BLE001 - one broken pod must not take the node down; retry it
                log.exception("pod %s: agent error, retrying", self.name)
                self.wake.wait(2)
            self.wake.wait(TICK)
            self.wake.clear()

    def iterate(self) -> bool:
        """One pass; True when this pod is done on this node."""
        if self.vanished:
            self.kill_all()
            self.release()
            return True
        if self.ctx.is_lost(self.node):
            if self.procs:
                self.kill_all()  # a lost node's containers are gone; nothing is reported until it returns
            return False
        if self.pod["metadata"].get("deletionTimestamp"):
            self.terminate()
            return True
        self.step()
        return False

    def step(self) -> None:
        terminal = self.phase in ("Succeeded", "Failed")
        if not terminal:
            if self.sandbox is None:
                self.setup_sandbox()
            self.reap()
            self.enforce_kills()
            self.start_due()
            self.probe()
        self.push_status()
        if self.phase in ("Succeeded", "Failed") and self.sandbox is not None and self.sandbox.netns:
            network.delete_netns(self.sandbox.netns)  # a finished pod keeps its IP in status, not its sandbox
            self.sandbox.netns = None

    def setup_sandbox(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        meta = self.pod["metadata"]
        if self.pod["spec"].get("hostNetwork"):
            self.sandbox = launcher.Sandbox(self.path, None, self.ctx.host_ip)
        else:
            ip = self.ctx.ipam.allocate(self.uid)
            self.sandbox = launcher.Sandbox(self.path, network.create_netns(self.uid, ip), ip)
        state.write_json(state.runtime_file(self.path), {
            "namespace": meta["namespace"], "name": meta["name"], "uid": self.uid, "node": self.node,
            "netns": self.sandbox.netns, "ip": self.sandbox.ip,
            "containers": [r.name for r in self.mains], "initContainers": [r.name for r in self.inits]})
        self.start_time = self.start_time or podstatus.now()

    def reap(self) -> None:
        for rec in self.inits + self.mains:
            proc = self.procs.get(rec.name)
            code = proc.poll() if proc else None
            if code is None:
                continue
            del self.procs[rec.name]
            self.finish(rec, code)

    def finish(self, rec: ContainerRecord, code: int) -> None:
        started = rec.state.get("running", {}).get("startedAt")
        text = state.termination_file(self.path, rec.name).read_text(errors="replace")
        tail = launcher.log_tail(self.path, rec.name)
        message = containers.termination_message(self.specs[rec.name], text, tail, code)
        rec.state = podstatus.terminated(code, started, message)
        rec.ready = False
        self.schedule_restart(rec)

    def schedule_restart(self, rec: ContainerRecord) -> None:
        code = rec.exit_code
        restart = code != 0 and self.policy != "Never" if rec.init else podstatus.should_restart(self.policy, code)
        if self.killing.pop(rec.name, None) is not None:
            restart = self.policy != "Never"  # killed for a failed liveness probe: restarted whatever it exited with
        if restart and not self.pod["metadata"].get("deletionTimestamp"):
            delay = min(MAX_BACKOFF, 2.0 ** rec.restart_count)
            self.not_before[rec.name] = time.monotonic() + delay
            rec.last_state, rec.state = rec.state, {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:.0f}s restarting failed container={rec.name} pod={self.name}"}}

    def start_due(self) -> None:
        for rec in self.inits:
            if rec.exit_code == 0:
                continue
            if "waiting" in rec.state:
                self.start_container(rec)
            return  # init containers run one at a time, in order
        for rec in self.mains:
            if "waiting" in rec.state:
                self.start_container(rec)

    def start_container(self, rec: ContainerRecord) -> None:
        if time.monotonic() < self.not_before.get(rec.name, 0):
            return
        spec = self.specs[rec.name]
        restarting = bool(rec.last_state)
        image = images.config_for(spec.get("image"), self.ctx.repo_root)
        # The downward API sees the pod's IP before any status carrying it has come back from the apiserver.
        pod = {**self.pod, "status": {**(self.pod.get("status") or {}), "podIP": self.sandbox.ip,
                                      "hostIP": self.ctx.host_ip}}
        try:
            if self.volumes is None:
                self.volumes = volumes.materialize(self.ctx.core, pod, self.path)
            env = launcher.base_env(pod)
            env.update(image.env if image else {})
            env.update(containers.service_env(services_for_env(self.ctx.core, pod)))
            env.update(containers.resolve_env(pod, spec, self.lookup, self.ctx.allocatable))
            self.procs[rec.name] = launcher.launch(pod, spec, self.sandbox, env, self.volumes,
                                                   self.ctx.repo_root, restarting, image)
        except (LookupError, ValueError, OSError, ApiException) as exc:
            rec.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            self.not_before[rec.name] = time.monotonic() + 2
            return
        self.envs[rec.name] = env
        self.procs[rec.name].host_pid(wait=2.0)  # "running" then implies a pid file that faults and probes can use
        if restarting:
            rec.restart_count += 1
        rec.state = {"running": {"startedAt": podstatus.now()}}
        self.readiness[rec.name] = probes.Readiness(None if rec.init else spec.get("readinessProbe"))
        self.liveness[rec.name] = probes.Liveness(None if rec.init else spec.get("livenessProbe"))
        rec.ready = self.readiness[rec.name].ready and not rec.init

    def probe(self) -> None:
        for rec in self.mains:
            if "running" not in rec.state or rec.name in self.killing:
                continue
            proc = self.procs.get(rec.name)
            readiness, liveness = self.readiness.get(rec.name), self.liveness.get(rec.name)
            if readiness is not None and readiness.due():
                readiness.record(self.run_probe(rec.name, readiness.probe, proc) is None)
                rec.ready = readiness.ready
            if liveness is not None and liveness.due():
                failed = self.run_probe(rec.name, liveness.probe, proc)
                if failed is not None:  # a kubelet posts one for each failed readiness probe too; not done here
                    podevents.post(self.ctx.core, self.pod, rec.name, self.node, "Warning", "Unhealthy",
                                   f"Liveness probe failed: {failed}")
                if liveness.record(failed is None):
                    self.kill_for_liveness(rec.name, liveness.probe)

    def run_probe(self, name: str, probe: dict, proc) -> str | None:
        return probes.check(probe, self.specs[name], self.sandbox.ip, proc.host_pid(0) if proc else None,
                            self.envs.get(name, {}))

    def kill_for_liveness(self, name: str, probe: dict) -> None:
        """As a kubelet: SIGTERM, SIGKILL after the grace period; the restart policy then applies."""
        grace = probe.get("terminationGracePeriodSeconds") or self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        podevents.post(self.ctx.core, self.pod, name, self.node, "Normal", "Killing",
                       f"Container {name} failed liveness probe, will be restarted")
        log.info("pod %s: container %s failed its liveness probe; killing it", self.name, name)
        self.killing[name] = time.monotonic() + grace
        proc = self.procs.get(name)
        if proc:
            proc.signal(signal.SIGTERM)

    def enforce_kills(self) -> None:
        for name, deadline in self.killing.items():
            proc = self.procs.get(name)
            if proc and time.monotonic() >= deadline:
                proc.signal(signal.SIGKILL)

    def push_status(self, phase: str | None = None) -> None:
        phase = phase or self.phase
        inits_done = podstatus.init_outcome(self.policy, self.inits) == "done"
        previous = (self.pod.get("status") or {}).get("conditions") or []
        wanted = podstatus.wanted_conditions(phase, self.sandbox is not None, inits_done, self.mains)
        conds = podstatus.conditions(previous, wanted)
        patch = podstatus.status_patch(phase, self.sandbox.ip if self.sandbox else None, self.ctx.host_ip,
                                       self.start_time, self.inits, self.mains, conds)
        if patch == self.sent or self.ctx.is_lost(self.node):
            return
        try:
            result = self.ctx.core.patch_namespaced_pod_status(
                self.name_only, self.namespace, patch, _content_type=kube.STRATEGIC, _preload_content=False)
            self.pod["status"] = kube.as_dict(result).get("status", {})
            self.sent = patch
        except ApiException as exc:
            if exc.status == 404:
                self.vanished = True
            else:
                log.warning("status of %s: %s", self.name, exc.reason)

    # --- deletion ------------------------------------------------------------------------------------------
    def terminate(self) -> None:
        """As a kubelet does it: SIGTERM, SIGKILL after the grace period, final status, delete with grace 0."""
        for proc in self.procs.values():
            proc.signal(signal.SIGTERM)
        meta = self.pod["metadata"]
        # deletionTimestamp (whole seconds) marks the end of the grace period, even for an agent restarted meanwhile.
        left = min(podstatus.seconds_until(meta["deletionTimestamp"]) + 1, meta.get("deletionGracePeriodSeconds", 30))
        deadline = time.monotonic() + left
        while self.procs and time.monotonic() < deadline and not self.vanished:
            self.reap()
            self.wake.wait(TICK)
        self.kill_all()
        if not self.vanished:
            all_ok = all(r.exit_code == 0 for r in self.mains)
            self.push_status("Succeeded" if all_ok else "Failed")
            kube.ignore_missing(self.ctx.core.delete_namespaced_pod, self.name_only, self.namespace,
                                grace_period_seconds=0, body=client.V1DeleteOptions(
                                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)))
        self.release()

    def kill_all(self) -> None:
        for proc in self.procs.values():
            proc.signal(signal.SIGKILL)
        for rec in self.inits + self.mains:
            proc = self.procs.pop(rec.name, None)
            if proc:
                self.finish(rec, proc.wait())

    def release(self) -> None:
        if not self.pod["spec"].get("hostNetwork"):
            network.delete_netns(state.netns_name(self.uid))  # also one an earlier agent left for a finished pod
        self.ctx.ipam.release(self.uid)


def services_for_env(core: client.CoreV1Api, pod: dict) -> list[dict]:
    """What a kubelet turns into env vars: the `kubernetes` Service of `default` (KUBERNETES_SERVICE_HOST/PORT,
    which in-cluster clients read) always, and with enableServiceLinks (the default) the pod namespace's Services."""
    namespace = pod["metadata"]["namespace"]
    master = kube.get_or_none(core.read_namespaced_service, "kubernetes", "default")
    services = [master] if master else []
    if pod["spec"].get("enableServiceLinks", True):
        listed = kube.as_dict(core.list_namespaced_service(namespace, _preload_content=False)).get("items", [])
        # Listed first, so that the master Service's variables win over a namespace's own `kubernetes` Service.
        services = listed + services
    return services
