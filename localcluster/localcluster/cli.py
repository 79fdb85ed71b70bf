"""`localcluster up|down|status|env`: a real Kubernetes control plane on this machine for tests and demos."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from localcluster import controlplane


def find_root(start: Path | None = None) -> Path:
    """The repository root: LOCALCLUSTER_ROOT, else the nearest ancestor of the cwd holding localcluster/build.sh."""
    if env := os.environ.get("LOCALCLUSTER_ROOT"):
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for candidate in [here, *here.parents]:
        if (candidate / "localcluster" / "build.sh").is_file():
            return candidate
    # An editable install of this repository: the package sits in <root>/localcluster/localcluster/.
    package_root = Path(__file__).resolve().parents[2]
    if (package_root / "localcluster" / "build.sh").is_file():
        return package_root
    raise SystemExit("cannot find the repository root (a directory with localcluster/build.sh); set LOCALCLUSTER_ROOT")


def _up(args: argparse.Namespace) -> int:
    addons = [name for name, wanted in (("scheduler-plugins", args.scheduler_plugins), ("kueue", args.kueue),
                                        ("kwok", args.kwok)) if wanted]
    controlplane.ensure_up(
        args.root, args.nodes, gpus_per_node=args.gpus_per_node, node_cpu=args.node_cpu,
        node_memory=args.node_memory, apiserver_port=args.port, addons=addons,
        node_kind="process" if args.process_nodes else "real", profiling=args.profiling,
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    controlplane.stop(args.root)
    return 0


def _stop(args: argparse.Namespace) -> int:
    controlplane.stop_addon(args.root, args.addon)
    return 0


def _status(args: argparse.Namespace) -> int:
    components = controlplane.status(args.root)
    if not components:
        print("local cluster: not running")
        return 1
    info = controlplane.cluster_info(args.root)
    if info:
        print(f"local cluster at {info.server} (kubeconfig {info.kubeconfig})")
    for c in components:
        state = "healthy" if c.healthy else ("running, unhealthy" if c.running else "not running")
        print(f"  {c.name:<20} pid {c.pid!s:<8} {state:<20} {c.detail.splitlines()[0] if c.detail else ''}")
    healthy = controlplane.is_up(args.root)
    if healthy:
        nodes = controlplane.node_summary(args.root)
        print(f"  nodes: {len(nodes)}" + "".join(f"\n    {name:<20} Ready={ready}" for name, ready in nodes))
    return 0 if healthy else 1


def _env(args: argparse.Namespace) -> int:
    # The bin dir first on PATH: the kubectl built with the server (no version-skew warning).
    print(f"export KUBECONFIG={controlplane.Layout(args.root).kubeconfig}")
    print(f'export PATH="{controlplane.bin_dir(args.root)}:$PATH"')
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="repository root (default: found from the cwd)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the cluster (no-op when a healthy one runs)")
    up.add_argument("--nodes", type=int, default=3, help="nodes to start (0: none)")
    up.add_argument("--real-nodes", action="store_true",
                    help="the default: nodes made of the upstream kubelet, containerd, runc, CNI and kube-proxy, "
                         "running the images built from images/ (root; see localcluster/README.md)")
    up.add_argument("--process-nodes", action="store_true",
                    help="the process-backed node agent instead (no images: each pod a process tree from the "
                         "host's .venv); only its own tests and the fleet benchmark's light pods use it")
    up.add_argument("--gpus-per-node", type=int, default=0)
    up.add_argument("--node-cpu", default="8")
    up.add_argument("--node-memory", default="16Gi")
    up.add_argument("--port", type=int, default=None, help="apiserver port (default 6443, or a free one if busy)")
    up.add_argument("--scheduler-plugins", action="store_true",
                    help="also run scheduler-plugins' scheduler (Coscheduling) as scheduler-plugins-scheduler")
    up.add_argument("--kueue", action="store_true",
                    help="also run Kueue with ClusterQueue cluster-queue and LocalQueue default/user-queue")
    up.add_argument("--profiling", action="store_true",
                    help="the API server serves Go's CPU and heap profiles at /debug/pprof (bench/fleet_scale.py "
                         "--profile)")
    up.add_argument("--kwok", action="store_true",
                    help="also run kwok with 10 fake nodes (label type=kwok, taint kwok.x-k8s.io/node): pods there "
                         "are Running without processes, for fleet-size benchmarks")
    up.set_defaults(run=_up)
    commands.add_parser("down", help="stop every process of the cluster").set_defaults(run=_down)
    stop = commands.add_parser("stop", help="stop one add-on of a running cluster (kwok: and delete its nodes)")
    stop.add_argument("addon", choices=["scheduler-plugins", "kueue", "kwok"])
    stop.set_defaults(run=_stop)
    commands.add_parser("status", help="components, health and nodes").set_defaults(run=_status)
    commands.add_parser("env", help="print KUBECONFIG and PATH (the cluster kubectl first) export lines").set_defaults(
        run=_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.root = (args.root or find_root()).resolve()
    try:
        return args.run(args)
    except RuntimeError as err:
        print(f"localcluster {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
