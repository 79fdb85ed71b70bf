"""`elasticjob run` (the operator), `elasticjob crd` (print the CRD) and `elasticjob convert` (a PyTorchJob as an
ElasticJob)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from elasticjob import crd, integrations
from elasticjob.controller.loops import CONCURRENT_RECONCILES
from elasticjob.convert import ConversionError, InputError, convert_text
from elasticjob.domain import Settings
from elasticjob.lease import Where
from elasticjob.rendezvous_client import check_key

log = logging.getLogger("elasticjob")


@dataclass(frozen=True)
class RunConfig:
    """What the startup handler needs from the command line."""

    namespaces: list[str] | None  # None: every namespace
    key: bytes
    settings: Settings
    identity: str
    leader: Where | None  # with --leader-elect: the Lease this replica competes for
    concurrent_reconciles: int = CONCURRENT_RECONCILES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="elasticjob", description="Kubernetes operator for elastic PyTorch")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the operator against the current kube context")
    run.add_argument("--namespace", "-n", action="append", default=[],
                     help="watch this namespace (repeatable); default: all namespaces")
    run.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    run.add_argument("--liveness", default=None, metavar="URL",
                     help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    run.add_argument("--leader-elect", action="store_true",
                     help="several replicas: only the holder of a coordination.k8s.io Lease in the operator's "
                     "namespace (--operator-namespace) reconciles, the others watch and wait (the chart turns it "
                     "on); default: off, this process acts alone")
    run.add_argument("--leader-lease-name", default="elasticjob-operator", metavar="NAME",
                     help="name of that Lease (the chart: the release's full name)")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.add_argument("--log-format", choices=["full", "plain", "json"], default="full",
                     help="log lines as text (full: with time and logger) or JSON; each names its job")
    run.add_argument("--rendezvous-key-file", default=os.environ.get("ELASTICJOB_RENDEZVOUS_KEY_FILE"),
                     metavar="PATH", help="secret the tokens of the stores' control endpoints derive from; "
                     "default: a random one (stores made by an earlier operator process then ignore this one)")
    run.add_argument("--no-rendezvous-nudges", action="store_true",
                     help="never remove dead agents, end the last call or restart survivors: recovery at torch's "
                     "own pace (for comparisons)")
    run.add_argument("--no-store-peer-check", action="store_true",
                     help="let each job's store answer every peer that reaches its port, as torch's TCPStore does "
                     "(only where the network rewrites the pods' source addresses; the store otherwise answers "
                     "its job's pods alone)")
    run.add_argument("--no-network-policy", action="store_true",
                     help="do not create the NetworkPolicy around each namespace's rendezvous stores")
    run.add_argument("--operator-namespace", default=os.environ.get("POD_NAMESPACE"),
                     help="namespace of the operator's pods, which the NetworkPolicies admit to the control port")
    integrations.add_arguments(run)  # each integration's own flags (--kueue, ...)
    run.add_argument("--kit-image", default=os.environ.get("ELASTICJOB_KIT_IMAGE") or None, metavar="IMAGE",
                     help="image an init container copies the store and warm starts from into every job pod (the "
                     "operator's own; the chart sets it). Without it the worker image must carry elasticjob_store "
                     "and no job starts warm")
    run.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                     help="a Secret (in the job's namespace) every job pod gets in imagePullSecrets, for the kit's "
                     "and the workers' images; repeatable (the chart's jobImagePullSecrets)")
    run.add_argument("--taint-bad-nodes", action="store_true",
                     help="a node a job avoids for a reason of the node's own (a worker failed there, its node check "
                     "failed, a pod cut off there, a slow node) is also tainted elasticjob.dev/unhealthy:NoSchedule "
                     "for every pod until the last such avoidance ends (needs patch and list on nodes: the chart's "
                     "badNodes.taint); default: off, each job avoids the node for its own pods alone")
    run.add_argument("--operator-selector", default="app.kubernetes.io/name=elasticjob-operator",
                     help="labels of the operator's pods (k=v,...), which the NetworkPolicies admit")
    run.add_argument("--concurrent-reconciles", type=at_least_one, default=CONCURRENT_RECONCILES, metavar="N",
                     help="reconciles in flight at once; more wait for a slot (bounds the memory a fleet created "
                     "at once takes)")
    commands.add_parser("crd", help="print the ElasticJob CustomResourceDefinition (YAML)")
    convert = commands.add_parser("convert", help="print a Kubeflow PyTorchJob (kubeflow.org/v1) as an ElasticJob; "
                                  "what does not carry over is said on stderr (docs/migrating.md)")
    convert.add_argument("file", metavar="FILE", help="YAML of one or more documents, or a List (kubectl get -o "
                         "yaml), each item printed as a document; other objects pass through unchanged; - reads "
                         "standard input")
    return parser.parse_args(argv)


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def rendezvous_key(path: str | None) -> bytes:
    if path:
        try:  # the client's own check (tokens derived from a short key can be guessed), named by its file
            return check_key(Path(path).read_bytes().strip())
        except ValueError as short:
            raise SystemExit(f"elasticjob: {path}: {short}") from None
    log.warning("no --rendezvous-key-file: using a random key; stores created before a restart of this operator "
                "will refuse it, and their jobs recover at torch's own pace")
    return secrets.token_bytes(32)


def run_config(args: argparse.Namespace) -> RunConfig:
    clusterwide = args.all_namespaces or not args.namespace
    # In a pod the hostname is the pod's name: `kubectl get lease` names the leader's pod.
    identity = f"elasticjob-{socket.gethostname()}-{secrets.token_hex(4)}"
    leader = None
    if args.leader_elect:
        if not args.operator_namespace:
            raise SystemExit("elasticjob: --leader-elect needs the operator's namespace, where its Lease is: "
                             "--operator-namespace or POD_NAMESPACE")
        leader = Where(args.leader_lease_name, args.operator_namespace, identity)
    labels = tuple(tuple(pair.split("=", 1)) for pair in args.operator_selector.split(",") if "=" in pair)
    settings = Settings(network_policy=not args.no_network_policy, store_peer_check=not args.no_store_peer_check,
                        operator_namespace=args.operator_namespace,
                        operator_labels=labels, nudges=not args.no_rendezvous_nudges, kit_image=args.kit_image,
                        image_pull_secrets=tuple(args.image_pull_secret), taint_bad_nodes=args.taint_bad_nodes)
    settings = integrations.configure(settings, args)
    return RunConfig(None if clusterwide else list(args.namespace), rendezvous_key(args.rendezvous_key_file),
                     settings, identity, leader, args.concurrent_reconciles)


def run_operator(args: argparse.Namespace) -> None:
    from elasticjob import metrics
    from elasticjob.controller import kopf_app

    if not args.verbose:
        logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    kopf_app.run(run_config(args), verbose=args.verbose, log_format=args.log_format, liveness=args.liveness)


def convert_file(path: str) -> int:
    try:
        result = convert_text(sys.stdin.read() if path == "-" else Path(path).read_text())
    except InputError as error:  # no PyTorchJob as its API defines it (a type, an alias, its size): a usage error
        print(f"elasticjob convert: {path}: {error}", file=sys.stderr)
        return 2
    except (ConversionError, OSError) as error:  # a job this operator would run differently: said, not changed
        print(f"elasticjob convert: {path}: {error}", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(result.yaml())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "crd":
        sys.stdout.write(crd.crd_yaml(integrations.status_parts()))
    elif args.command == "convert":
        return convert_file(args.file)
    elif args.command == "run":
        run_operator(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
