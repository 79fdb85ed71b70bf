"""Local nodes: a kubelet + kube-proxy stand-in that runs pods as local process trees.

    python -m localcluster.nodeagent --kubeconfig K --state-dir .localcluster --nodes N [--gpus-per-node G]
    python -m localcluster.nodeagent --cleanup --state-dir .localcluster
    python -m localcluster.nodeagent logs NS/POD [-c CONTAINER] [-f] [--previous] [--state-dir .localcluster]

What a pod gets (module in brackets):
- Node objects local-node-0..N-1 with a Lease renewed every 5 s and a fresh Ready condition [nodes].
- Its own netns with eth0 on bridge ej0 (10.244.0.1/16) and an IP from 10.244.0.0/16 [network]; every container is
  PID 1 of its own PID namespace, with private mount and UTS namespaces (hostname = pod name) [shim, launcher].
- The image is ignored: the repo's .venv/bin leads PATH and the repo root is bind-mounted at /workspace, where the
  worker image keeps it; workingDir defaults to the repo root [launcher, containers].
- env with $(VAR) expansion, fieldRef, resourceFieldRef, configMap/secret refs and envFrom, after the Services'
  variables a kubelet sets (KUBERNETES_SERVICE_HOST/PORT always, the namespace's Services with enableServiceLinks)
  [containers]; volumes hostPath, emptyDir, configMap, secret, downwardAPI and projected (the ServiceAccount token,
  CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount, so in-cluster config works) [volumes].
- terminationMessagePath/-Policy, init containers in order, restart policies with a 1-10 s back-off, readiness and
  liveness probes (tcpSocket, httpGet, exec; a failed liveness probe posts Unhealthy and Killing Events, then the
  container gets SIGTERM, SIGKILL after the grace period, and is restarted unless restartPolicy is Never); startup
  probes, resource limits and GPUs are not enforced [podrunner, probes, podevents].
- The known images of this project (images.py: the operator's) supply the ENTRYPOINT, CMD and ENV their
  Dockerfile declares, so a container with `args` only (the chart's Deployment) runs what the image would [images].
- Graceful deletion (SIGTERM, SIGKILL at the deletionTimestamp, then delete with grace 0); a force-deleted pod is
  killed at once. A restarted agent adopts the running containers of pods that still exist [podrunner].
- ClusterIP Services through a userspace TCP proxy on ClusterIP:port (ClusterIPs live on `lo`) [proxy]; UDP,
  NodePort reachability and session affinity are not implemented.
- Logs in .localcluster/pods/<ns>_<pod>_<uid>/<container>.log, also served to `kubectl logs` [podlogs, kubeletapi].
- Faults (kill a pod, lose/restore a node, drain) in `python -m localcluster.faults` [faults].
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from kubernetes import client

from . import kube, kubeletapi, launcher, network, nodes, podlogs, processnodes, state
from .podrunner import NodeContext, PodRunner
from .proxy import ServiceProxy

log = logging.getLogger("localcluster.nodeagent")
REPO_ROOT = Path(__file__).resolve().parents[2]
RESYNC_SECONDS = 30


class Agent:
    def __init__(self, args: argparse.Namespace):
        self.state_dir = Path(args.state_dir).resolve()
        self.api = kube.api_client(args.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.names = set(nodes.node_names(args.nodes))
        self.cap = nodes.capacity(args.node_cpu, args.node_memory, args.gpus_per_node)
        self.stop = threading.Event()
        self.runners: dict[str, PodRunner] = {}
        self.lock = threading.Lock()
        self.swept = False
        self.ctx = NodeContext(self.core, self.state_dir, network.Ipam(self.state_dir), REPO_ROOT, state.BRIDGE_IP,
                               self.cap, lambda node: processnodes.is_lost(node, self.state_dir))

    def run(self) -> None:
        network.ensure_bridge()
        Path("/dev/termination-log").touch()  # bind target for every container's termination message
        kubeletapi.serve(self.state_dir, state.BRIDGE_IP, len(self.names), self.state_dir / "pki" / "ca.crt")
        beats = nodes.Heartbeats(self.api, sorted(self.names), self.cap, state.BRIDGE_IP, self.ctx.is_lost, self.stop)
        beats.register()
        beats.start()
        ServiceProxy(self.api, network.LoopbackIps(self.state_dir), self.stop, self.names).start()
        log.info("nodes %s registered; watching pods", ", ".join(sorted(self.names)))
        kube.watch_forever(self.core.list_pod_for_all_namespaces, self.on_event, self.on_list, self.stop)

    def ours(self, pod: dict) -> bool:
        return pod["spec"].get("nodeName") in self.names

    def on_list(self, pods: list[dict]) -> None:
        mine = [p for p in pods if self.ours(p)]
        live = {p["metadata"]["uid"] for p in mine}
        if not self.swept:
            kill_orphans(self.state_dir, live)  # pods deleted while no agent ran; the others get adopted
            self.swept = True
        with self.lock:
            for uid in set(self.runners) - live:
                self.runners.pop(uid).gone()
        self.ctx.ipam.keep_only(live | set(self.runners))
        for pod in mine:
            self.on_event("MODIFIED", pod)

    def on_event(self, kind: str, pod: dict) -> None:
        if not self.ours(pod):
            return
        uid = pod["metadata"]["uid"]
        with self.lock:
            runner = self.runners.get(uid)
            if kind == "DELETED":
                if runner:
                    self.runners.pop(uid).gone()  # force-deleted (or deleted by us): kill at once
                return
            if runner is None:
                runner = self.runners[uid] = PodRunner(self.ctx, pod)
                runner.start()
            else:
                runner.update(pod)


def kill_orphans(state_dir: Path, live_uids: set[str]) -> None:
    for pod_dir, rec in processnodes.runtime_records(state_dir):
        if rec["uid"] not in live_uids:
            kill_pod_dir(pod_dir, rec)
    wanted = {state.netns_name(uid) for uid in live_uids}
    for ns in set(network.list_netns()) - wanted:
        network.delete_netns(ns)


def kill_leftovers(state_dir: Path) -> None:
    for pod_dir, rec in processnodes.runtime_records(state_dir):
        kill_pod_dir(pod_dir, rec)


def kill_pod_dir(pod_dir: Path, rec: dict) -> None:
    processnodes.signal_pod_dir(pod_dir, rec, signal.SIGKILL)
    if rec.get("netns"):
        network.delete_netns(rec["netns"])
    state.runtime_file(pod_dir).unlink(missing_ok=True)


def cleanup(state_dir: Path) -> None:
    kill_leftovers(state_dir)
    kill_shims()
    network.teardown_all(state_dir)
    for marker in state.faults_dir(state_dir).glob("*.lost"):
        marker.unlink()


def kill_shims() -> None:
    """Shims whose pid file never got written (killed mid-start) are found by their command line."""
    shim = str(launcher.SHIM)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if shim.encode() in cmdline:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def parse(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["logs"]:
        p = argparse.ArgumentParser(prog="python -m localcluster.nodeagent logs")
        p.add_argument("pod", help="NS/POD")
        p.add_argument("-c", "--container")
        p.add_argument("-f", "--follow", action="store_true")
        p.add_argument("-p", "--previous", action="store_true")
        p.add_argument("--state-dir", default=".localcluster")
        args = p.parse_args(argv[1:])
        args.cmd = "logs"
        return args
    p = argparse.ArgumentParser(prog="python -m localcluster.nodeagent", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", default=".localcluster/kubeconfig")
    p.add_argument("--state-dir", default=".localcluster")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=0)
    p.add_argument("--node-cpu", default="8")
    p.add_argument("--node-memory", default="16Gi")
    p.add_argument("--cleanup", action="store_true", help="kill every pod process, remove netns, bridge and ClusterIPs")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.cmd = "cleanup" if args.cleanup else "run"
    return args


def show_logs(args: argparse.Namespace) -> int:
    ns, _, pod = args.pod.partition("/")
    try:
        if args.follow:
            podlogs.follow(args.state_dir, ns, pod, args.container)
        else:
            sys.stdout.write(podlogs.read(args.state_dir, ns, pod, args.container, args.previous))
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.cmd == "logs":
        return show_logs(args)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    if args.cmd == "cleanup":
        cleanup(Path(args.state_dir))
        return 0
    agent = Agent(args)
    signal.signal(signal.SIGTERM, lambda *_: (agent.stop.set(), sys.exit(0)))
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
