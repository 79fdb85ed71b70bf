"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) as local processes,
plus, when asked for, the add-ons in addons.py (scheduler-plugins' scheduler, Kueue).

Every process runs detached in its own session, logs to `.localcluster/logs/<name>.log` and records its pid in
`.localcluster/pids/<name>.pid`; the session id is the pid, which is how `stop` finds every descendant.
The cluster is ephemeral: a fresh `up` starts from an empty etcd; the CA and certificates are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
import urllib.error
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localcluster import builds, components, realnodes, sessions
from localcluster import pki as pki_mod
from localcluster.addons import ADDONS, check_names
from localcluster.addons import ensure as ensure_addons
from localcluster.addons import stop as stop_addon_locked
from localcluster.health import Health, api_json, check, ready_nodes, wait_healthy
from localcluster.layout import Endpoints, Layout, load_endpoints, record, recorded_nodes
from localcluster.nodes import node_names
from localcluster.realnodes import preflight

CORE = {"etcd", "apiserver", "controller-manager", "scheduler"}
STOP_ORDER = [*ADDONS, "nodeagent", "scheduler", "controller-manager", "apiserver", "etcd"]
STOP_GROUPS = [list(ADDONS), ["nodeagent"], ["scheduler", "controller-manager", "apiserver"], ["etcd"]]
STOP_GRACE_SECONDS = 20.0
COMPONENT_PROGRAMS = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "unshare",
                      "kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2",
                      *(addon.BINARY for addon in ADDONS.values())}

Log = Callable[[str], None]


def _print(message: str) -> None:
    print(message, flush=True)


@dataclass
class Cluster:
    root: Path
    kubeconfig: Path
    server: str
    ports: dict[str, int]
    nodes: int
    started_now: bool = False


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str = ""


# ---------------------------------------------------------------- binaries


def ensure_binaries(root: Path, log: Log = _print) -> Path:
    """Runs build.sh (instant when cached) and returns the bin dir, relaying its progress lines during a build."""
    return builds.run(Layout(root).build_script, [], "the control plane", log)


def bin_dir(root: Path) -> Path:
    """Where build.sh keeps kube-apiserver, kubectl and the rest, built or not."""
    return builds.bin_dir(Layout(root).build_script)


def running_another_release(layout: Layout) -> Path | None:
    """The running API server's binary when it is not of the release asked for (ELASTICJOB_K8S_VERSION picks
    build.sh's bin dir), else None: a cluster of another release is not reused as if it were the one asked for."""
    pid = sessions.read_pid(layout, "apiserver")
    args = sessions.cmdline(pid).split() if pid else []
    program = next((Path(arg) for arg in args if arg.endswith("/kube-apiserver")), None)
    return program if program and program.parent != bin_dir(layout.root) else None


# ---------------------------------------------------------------- lifecycle


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    """One `up`/`down` at a time per state dir, so parallel test sessions do not start two clusters."""
    layout.state.mkdir(parents=True, exist_ok=True)
    with open(layout.state / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _recorded_components(layout: Layout) -> list[str]:
    return [name for name in STOP_ORDER if layout.pid_file(name).exists()]


def status(root: Path) -> list[ComponentStatus]:
    layout = Layout(root.resolve())
    endpoints = load_endpoints(layout)
    result = []
    for name in reversed(STOP_ORDER):
        pid = sessions.read_pid(layout, name)
        if pid is None:
            continue
        running = sessions.ours(layout, pid)
        health = check(endpoints, name) if running and endpoints else Health(False, "not running")
        result.append(ComponentStatus(name, pid, running, health.ok, health.detail))
    return result


def _healthy(seen: list[ComponentStatus], names: set[str]) -> bool:
    chosen = [c for c in seen if c.name in names]
    return {c.name for c in chosen} == names and all(c.running and c.healthy for c in chosen)


def is_up(root: Path) -> bool:
    """The control plane and, when one was started, the node agent run and are healthy."""
    seen = status(root)
    return _healthy(seen, CORE | {c.name for c in seen})


def _cluster(layout: Layout, endpoints: Endpoints, nodes: int, started_now: bool) -> Cluster:
    return Cluster(layout.root, layout.kubeconfig, endpoints.server, dict(endpoints.ports), nodes, started_now)


def _start_control_plane(layout: Layout, bin_dir: Path, endpoints: Endpoints, log: Log, profiling: bool) -> None:
    etcd = sessions.start(layout, "etcd", components.etcd_argv(bin_dir, endpoints))
    wait_healthy(endpoints, "etcd", etcd, 30, log)
    apiserver = sessions.start(layout, "apiserver", components.apiserver_argv(bin_dir, endpoints, profiling))
    wait_healthy(endpoints, "apiserver", apiserver, 120, log)
    controller_manager = sessions.start(
        layout, "controller-manager", components.controller_manager_argv(bin_dir, endpoints))
    scheduler = sessions.start(layout, "scheduler", components.scheduler_argv(bin_dir, endpoints))
    wait_healthy(endpoints, "controller-manager", controller_manager, 60, log)
    wait_healthy(endpoints, "scheduler", scheduler, 60, log)
    _wait_controllers_running(endpoints, controller_manager, 60, log)


def _wait_controllers_running(endpoints: Endpoints, proc: subprocess.Popen, timeout: float, log: Log) -> None:
    """Healthz turns ok before the controllers start; the `default` ServiceAccount shows they run (and pods
    can be created in the default namespace)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"controller-manager exited with code {proc.returncode}")
        try:
            api_json(endpoints, "/api/v1/namespaces/default/serviceaccounts/default")
            log(f"  controllers running ({time.monotonic() - started:.1f}s)")
            return
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
        time.sleep(0.25)
    raise RuntimeError(f"no default ServiceAccount after {timeout:.0f}s: the controllers do not run")


def _wait_nodes_ready(endpoints: Endpoints, proc: subprocess.Popen, count: int, timeout: float, log: Log) -> None:
    started = time.monotonic()
    ready: list[str] = []
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(
                f"node agent exited with code {proc.returncode}; log tail:\n"
                f"{sessions.tail(endpoints.layout.log_file('nodeagent'))}"
            )
        ready = ready_nodes(endpoints)
        if len(ready) >= count:
            log(f"  {len(ready)} nodes Ready ({time.monotonic() - started:.1f}s): {', '.join(sorted(ready))}")
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"only {len(ready)}/{count} nodes Ready after {timeout:.0f}s ({ready}); node agent log tail:\n"
        f"{sessions.tail(endpoints.layout.log_file('nodeagent'))}"
    )


def _start_nodes(layout: Layout, endpoints: Endpoints, nodes: components.NodeOptions, log: Log,
                 images: realnodes.images.ProjectImages | None = None) -> int:
    if nodes.count == 0:
        log("  no nodes requested (--nodes 0)")
        return 0
    if nodes.kind == "real":
        log(f"  starting {nodes.count} real nodes (kubelet, containerd, runc, CNI bridge, kube-proxy)")
        realnodes.up(layout, node_names(nodes.count), bin_dir(layout.root), log, images)
        return nodes.count
    if not components.nodeagent_available():
        log("  node agent module localcluster.nodeagent not found: starting without nodes")
        return 0
    log(f"  starting node agent with {nodes.count} nodes")
    agent = sessions.start(layout, "nodeagent", components.nodeagent_argv(layout, nodes))
    _wait_nodes_ready(endpoints, agent, nodes.count, 120, log)
    return nodes.count


def _add_missing_nodes(layout: Layout, endpoints: Endpoints, nodes: components.NodeOptions, log: Log) -> int:
    """A cluster brought up with fewer nodes (e.g. --nodes 0), or whose agent died, gets an agent when a
    caller wants nodes; the control plane and its objects stay as they are."""
    if nodes.kind == "real":
        return _add_missing_real_nodes(layout, endpoints, nodes, log)
    if realnodes.running(layout):
        raise RuntimeError("the running local cluster has real nodes, and process-backed nodes were asked for: "
                           "stop it first (localcluster down)")
    agent = sessions.read_pid(layout, "nodeagent")
    died = agent is not None and not sessions.ours(layout, agent)
    if died:
        log(f"  the node agent had exited (see {layout.log_file('nodeagent')})")
        layout.pid_file("nodeagent").unlink()
    ready = len(ready_nodes(endpoints))
    # Nodes of a dead agent still look Ready for the grace period, so they do not count.
    enough = ready >= nodes.count and not died
    if nodes.count == 0 or enough or (agent is not None and not died) or not components.nodeagent_available():
        log(f"  {ready} nodes Ready")
        return ready
    try:
        count = _start_nodes(layout, endpoints, nodes, log)
    except BaseException:
        if (pid := sessions.read_pid(layout, "nodeagent")) is not None:
            sessions.stop_sessions([pid], STOP_GRACE_SECONDS)
            layout.pid_file("nodeagent").unlink(missing_ok=True)
        raise
    record(layout, endpoints, count)
    return count


def _add_missing_real_nodes(layout: Layout, endpoints: Endpoints, nodes: components.NodeOptions, log: Log) -> int:
    """Real nodes that stopped (or were lost and not restored) start again; running ones are left alone."""
    running = realnodes.running(layout)
    if recorded_nodes(layout) and not running and layout.pid_file("nodeagent").exists():
        raise RuntimeError("the running local cluster has process-backed nodes, and real nodes were asked for: "
                           "stop it first (localcluster down)")
    if len(running) >= nodes.count:
        log(f"  {len(running)} real nodes running")
        return len(running)
    count = _start_nodes(layout, endpoints, nodes, log)
    record(layout, endpoints, count)
    return count


def _fresh_state(layout: Layout) -> None:
    """Forgets the previous cluster's objects and processes; keeps the PKI and the logs."""
    for path in [layout.etcd_data, layout.pids, layout.cluster_file]:
        if path.is_dir():
            subprocess.run(["rm", "-rf", str(path)], check=True)
        elif path.exists():
            path.unlink()


def _up_locked(layout: Layout, nodes: components.NodeOptions, apiserver_port: int | None, wanted: list[str],
               log: Log, profiling: bool) -> Cluster:
    if nodes.kind == "real" and nodes.count and (missing := preflight.problems()):
        raise RuntimeError("real nodes cannot start on this machine:\n  " + "\n  ".join(missing))
    endpoints = load_endpoints(layout)
    if endpoints and _healthy(status(layout.root), CORE):
        if other := running_another_release(layout):
            raise RuntimeError(f"the running local cluster's API server is {other}, of another Kubernetes release "
                               "than the one asked for (K8S_VERSION): stop it first (localcluster down)")
        log(f"local cluster already running at {endpoints.server}")
        if profiling:
            log("  --profiling: the running API server keeps the setting it started with (down, then up, to change it)")
        count = _add_missing_nodes(layout, endpoints, nodes, log)
        ensure_addons(layout, endpoints, wanted, log)
        return _cluster(layout, endpoints, count, started_now=False)
    if _recorded_components(layout):
        log("found a partly running cluster: stopping it first")
        _down_locked(layout, log)
    started = time.monotonic()
    log(f"starting a local Kubernetes control plane in {layout.state}")
    # The real nodes' images need nothing from the Go build: they build beside it, and the nodes take them.
    images = realnodes.project_images(layout, log) if nodes.kind == "real" and nodes.count else None
    with images or contextlib.nullcontext():
        bin_dir = ensure_binaries(layout.root, log)
        log(f"  Kubernetes {components.release(bin_dir)} from {bin_dir}")
        pki_mod.ensure_pki(layout.pki)
        _fresh_state(layout)
        endpoints = Endpoints(layout, components.choose_ports(apiserver_port))
        components.write_kubeconfigs(endpoints)
        try:
            _start_control_plane(layout, bin_dir, endpoints, log, profiling)
            record(layout, endpoints, 0)
            count = _start_nodes(layout, endpoints, nodes, log, images)
            record(layout, endpoints, count)
            ensure_addons(layout, endpoints, wanted, log)
        except BaseException:
            log("start failed: stopping what was started")
            _down_locked(layout, log)
            raise
    record(layout, endpoints, count)
    log(f"local cluster up at {endpoints.server} in {time.monotonic() - started:.1f}s; "
        f"export KUBECONFIG={layout.kubeconfig}")
    return _cluster(layout, endpoints, count, started_now=True)


def ensure_up(
    root: Path, nodes: int = 3, *, gpus_per_node: int = 0, node_cpu: str = "8", node_memory: str = "16Gi",
    apiserver_port: int | None = None, addons: Iterable[str] = (), node_kind: str | None = None, log: Log = _print,
    profiling: bool = False,
) -> Cluster:
    """Starts the cluster unless a healthy one is already running; returns how to reach it. `addons` (names in
    ADDONS) are started too, on a running cluster as well; add-ons already running are kept either way.
    `profiling`: the API server serves Go's profiles at /debug/pprof (to the admin credentials)."""
    layout = Layout(root.resolve())
    # No kind asked for: the running cluster's (an add-on started for a test keeps the nodes it found), else real.
    kind = node_kind or ("process" if layout.pid_file("nodeagent").exists() else "real")
    options = components.NodeOptions(nodes, gpus_per_node, node_cpu, node_memory, kind)
    wanted = check_names(addons)
    with _locked(layout):
        return _up_locked(layout, options, apiserver_port, wanted, log, profiling)


def _run_nodeagent_cleanup(layout: Layout, log: Log) -> None:
    if not components.nodeagent_available():
        return
    argv = components.nodeagent_cleanup_argv(layout)
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=layout.root)
    except subprocess.TimeoutExpired:
        log("  node agent cleanup did not finish within 60s")
        return
    if result.returncode != 0:
        log(f"  node agent cleanup failed ({result.returncode}): {result.stderr.strip()[-500:]}")


def _stray_processes(layout: Layout) -> list[str]:
    """Processes that still name the state dir on their command line (besides this one and its ancestors)."""
    mine = {os.getpid(), os.getppid()}
    strays = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine and sessions.alive(int(entry.name)):
            cmd = sessions.cmdline(int(entry.name))
            program = Path(cmd.split(" ", 1)[0]).name
            if str(layout.state) in cmd and (program in COMPONENT_PROGRAMS or "localcluster.nodeagent" in cmd):
                strays.append(f"{entry.name}: {cmd[:160]}")
    return strays


def _may_signal(layout: Layout, sid: int) -> bool:
    """A live session leader that is not ours means the pid was recycled (e.g. after a reboot): leave it alone.
    A dead leader's session id cannot be reused while its members live, so those are still ours."""
    return not sessions.alive(sid) or sessions.ours(layout, sid)


def _down_locked(layout: Layout, log: Log) -> list[str]:
    groups = STOP_GROUPS
    realnodes.down(layout, bin_dir(layout.root), log)  # before the API server: a kubelet going away tells it so
    # The agent's cleanup touches host network state, so it runs only for a cluster that had an agent.
    had_agent = layout.pid_file("nodeagent").exists()
    for names in groups:
        pids = [sessions.read_pid(layout, name) for name in names]
        sids = [pid for pid in pids if pid is not None and _may_signal(layout, pid)]
        if not sids:
            continue
        survivors = sessions.stop_sessions(sids, STOP_GRACE_SECONDS)
        for name in names:
            layout.pid_file(name).unlink(missing_ok=True)
        log(f"  stopped {', '.join(names)}" + (f" (survivors: {survivors})" if survivors else ""))
    if had_agent:
        _run_nodeagent_cleanup(layout, log)
    layout.cluster_file.unlink(missing_ok=True)
    return _stray_processes(layout)


def stop(root: Path, log: Log = _print) -> None:
    """Stops every process of the cluster; raises if one survives. Keeps binaries, PKI and logs."""
    layout = Layout(root.resolve())
    if not layout.state.exists():
        log("no local cluster state: nothing to stop")
        return
    with _locked(layout):
        strays = _down_locked(layout, log)
    if strays:
        raise RuntimeError("processes of the local cluster are still running:\n" + "\n".join(strays))
    log("local cluster stopped")


def stop_addon(root: Path, name: str, log: Log = _print) -> None:
    """Stops one add-on (and what it registered, e.g. kwok's Nodes); the cluster keeps running."""
    layout = Layout(root.resolve())
    [name] = check_names([name])
    with _locked(layout):
        endpoints = load_endpoints(layout)
        if endpoints is None:
            log("no local cluster running: nothing to stop")
            return
        stop_addon_locked(layout, endpoints, name, log)


def cluster_info(root: Path) -> Cluster | None:
    layout = Layout(root.resolve())
    endpoints = load_endpoints(layout)
    if endpoints is None:
        return None
    return _cluster(layout, endpoints, recorded_nodes(layout), started_now=False)


def node_summary(root: Path) -> list[tuple[str, str]]:
    """(name, Ready status) of every Node, for `localcluster status`."""
    layout = Layout(root.resolve())
    endpoints = load_endpoints(layout)
    if endpoints is None:
        return []
    summary = []
    for node in api_json(endpoints, "/api/v1/nodes").get("items", []):
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        summary.append((node["metadata"]["name"], conditions.get("Ready", "Unknown")))
    return summary
