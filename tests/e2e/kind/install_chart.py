"""`helm upgrade --install --wait` of charts/elasticjob-operator on the kind cluster, with real Helm (its Go SDK,
as the local cluster's operatorchart.py installs it), for tests/e2e/kind/up.sh: the operator's image loaded into
the node (never pulled), watching the given namespaces only."""

from __future__ import annotations

import argparse
from pathlib import Path

from localcluster import operatorchart


def values(image: str, watch: list[str]) -> dict:
    repository, _, tag = image.rpartition(":")
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}, "logLevel": "debug",
            "watch": {"allNamespaces": False, "namespaces": watch}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--image", required=True, help="repository:tag, as loaded into the kind node")
    parser.add_argument("--watch", action="append", required=True, help="a namespace the operator watches")
    args = parser.parse_args()
    release = operatorchart.install_or_upgrade(args.kubeconfig, values(args.image, args.watch),
                                               namespace=args.namespace)
    print(f"release {release.name} revision {release.revision} in {release.namespace}", flush=True)


if __name__ == "__main__":
    main()
