"""Faults on real nodes, done to the real parts:

- a container's main process is signalled through its node's containerd (`ctr tasks kill`), as the kernel's OOM
  killer or a crash would end it; the kubelet sees the exit and applies the pod's restartPolicy;
- a pod is cut off the network by DROP rules in its node's FORWARD chain (the bridge's traffic passes it):
  its processes live on, silent, and the kubelet still sees it running;
- a node is lost (node.lose) or cut off as a whole (netns.partition);
- a pod's link is made slow by a token bucket (tbf) qdisc on eth0 in the pod's own network namespace (a rate on
  what the pod sends; this kernel has no netem), as a sick NIC or a port negotiated down: every packet arrives,
  late;
- a pod is slowed by a CPU quota on each of its containers' cgroups (the host's cgroup v1 `cpu` controller:
  cpu.cfs_quota_us over cpu.cfs_period_us), as a throttled or overheating node runs: every process lives on,
  slower.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kubernetes import client

from localcluster.realnodes import netns
from localcluster.realnodes.plan import RealNode

RULE_COMMENT = "localcluster-partition"


def node_named(state: Path, name: str) -> RealNode:
    return RealNode(int(name.rsplit("-", 1)[1]), name, state)


def running_containers(pod: client.V1Pod) -> list[str]:
    """The containerd ids of the pod's running containers (its status's `containerd://<id>`)."""
    return [status.container_id.split("://", 1)[1] for status in pod.status.container_statuses or []
            if status.state.running is not None and status.container_id]


def kill_containers(core: client.CoreV1Api, state: Path, namespace: str, name: str, signal: int) -> int:
    """Signals the main process of each running container of the pod; returns how many were signalled."""
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.spec.node_name:
        return 0
    node = node_named(state, pod.spec.node_name)
    hits = 0
    for container in running_containers(pod):
        result = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "tasks", "kill",
                                 "--signal", str(int(signal)), container], capture_output=True, text=True)
        hits += result.returncode == 0
    return hits


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000


def _container_pids(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> list[int]:
    """The main process of each running container of the pod, as its node's containerd lists its tasks."""
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.spec.node_name:
        return []
    node = node_named(state, pod.spec.node_name)
    wanted = set(running_containers(pod))
    listing = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "tasks", "ls"],
                             capture_output=True, text=True, check=True).stdout
    pids = []
    for line in listing.splitlines()[1:]:  # TASK PID STATUS
        fields = line.split()
        if len(fields) >= 3 and fields[0] in wanted and fields[2] == "RUNNING":
            pids.append(int(fields[1]))
    return pids


def cpu_cgroup(pid: int) -> Path:
    """The directory of the process's cgroup under the v1 `cpu` controller (the `cpu` line of /proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CGROUP_CPU / path.lstrip("/")
    raise RuntimeError(f"process {pid} has no cgroup v1 cpu controller: cannot throttle it here")


def throttle_pod(core: client.CoreV1Api, state: Path, namespace: str, name: str, percent: int | None) -> int:
    """Caps each running container of the pod at `percent` of one CPU (None: lifts the cap); returns how many."""
    pids = _container_pids(core, state, namespace, name)
    for pid in pids:
        group = cpu_cgroup(pid)
        (group / "cpu.cfs_period_us").write_text(f"{CFS_PERIOD_US}\n")
        quota = -1 if percent is None else max(1000, CFS_PERIOD_US * percent // 100)
        (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    return len(pids)


def _pod_ip_and_node(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> tuple[str, RealNode] | None:
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.status.pod_ip or not pod.spec.node_name:
        return None
    return pod.status.pod_ip, node_named(state, pod.spec.node_name)


def _forward_rules(node: RealNode, ip: str, action: str) -> None:
    for match in ("-s", "-d"):
        subprocess.run(["nsenter", f"--net=/run/netns/{node.netns}", "--", "iptables", action, "FORWARD", match, ip,
                        "-m", "comment", "--comment", RULE_COMMENT, "-j", "DROP"], capture_output=True, check=False)


def partition_pod(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> int:
    found = _pod_ip_and_node(core, state, namespace, name)
    if found is None:
        return 0
    _forward_rules(found[1], found[0], "-I")
    return 1


def heal_pod(core: client.CoreV1Api, state: Path, namespace: str, name: str) -> int:
    found = _pod_ip_and_node(core, state, namespace, name)
    if found is None:
        return 0
    _forward_rules(found[1], found[0], "-D")
    return 1


def partition_node(state: Path, name: str) -> None:
    netns.partition(node_named(state, name))


def heal_node(state: Path, name: str) -> None:
    netns.heal(node_named(state, name))


def slow_link(core: client.CoreV1Api, state: Path, namespace: str, name: str, rate_mbit: int | None) -> int:
    """What the pod sends goes at `rate_mbit` at most (None: its link as it was), by a qdisc on eth0 inside the
    pod's own network namespace, which goes with the pod (one on the node's bridge would slow every pod of the
    node, and outlive the test): 1 once the pod has a running container, else 0."""
    pids = _container_pids(core, state, namespace, name)
    if not pids:
        return 0
    tc = ["nsenter", "-t", str(pids[0]), "-n", "--", "tc", "qdisc"]
    if rate_mbit is None:
        subprocess.run([*tc, "del", "dev", "eth0", "root"], capture_output=True, check=False)
        return 1
    subprocess.run([*tc, "replace", "dev", "eth0", "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "32kbit",
                    "latency", "400ms"], capture_output=True, check=True)
    return 1
