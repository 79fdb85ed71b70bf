"""`elasticjob run` (the operator) and `elasticjob crd` (print the CRD)."""

from __future__ import annotations

import argparse
import logging
import secrets
import socket
import sys

from elasticjob import crd
from elasticjob.peering import Peering


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
    run.add_argument("--peering", default=None, metavar="NAME",
                     help="kopf peering object for running several replicas (one is active); default: standalone")
    run.add_argument("--priority", type=int, default=None,
                     help="kopf peering priority; default with --peering: random, so exactly one replica is active "
                          "(kopf pauses every operator that shares the highest priority)")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.add_argument("--log-format", choices=["full", "plain", "json"], default="full",
                     help="log lines as text (full: with time and logger) or JSON; each names its job")
    commands.add_parser("crd", help="print the ElasticJob CustomResourceDefinition (YAML)")
    return parser.parse_args(argv)


class QuietEventHandlers(logging.Filter):
    """kopf logs every watch-event handler call; ours only wake a reconcile loop, which logs what matters."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Handler '") and message.endswith("_event' succeeded."))


def run_operator(args: argparse.Namespace) -> None:
    import kopf

    import elasticjob.handlers  # noqa: F401  (registers the handlers)
    from elasticjob import metrics

    # kopf's formatter prefixes every line about a job with [namespace/name].
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()], log_prefix=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(QuietEventHandlers())
    if not args.verbose:
        logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    clusterwide = args.all_namespaces or not args.namespace
    priority = args.priority if args.priority is not None else (secrets.randbelow(2**31) + 1 if args.peering else 0)
    identity = f"elasticjob-{socket.gethostname()}-{secrets.token_hex(4)}"
    peers = Peering(args.peering, identity, priority, clusterwide) if args.peering else None
    kopf.run(clusterwide=clusterwide, namespaces=[] if clusterwide else args.namespace,
             liveness_endpoint=args.liveness, standalone=args.peering is None, peering_name=args.peering,
             priority=priority, identity=identity, memo=kopf.Memo(peering=peers))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "crd":
        sys.stdout.write(crd.crd_yaml())
    elif args.command == "run":
        run_operator(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
