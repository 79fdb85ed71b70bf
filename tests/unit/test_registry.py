"""The local registry's files and the nodes' containerd configuration for it (pure parts)."""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path

import pytest
import yaml

from localcluster import registry
from localcluster.realnodes import plan


@pytest.mark.parametrize("side, address, read_only", [(registry.PULL, "10.244.0.1:5000", True),
                                                      (registry.PUSH, "127.0.0.1:5001", False)])
def test_the_registry_serves_tls_of_the_cluster_ca_with_htpasswd(side, address, read_only) -> None:
    """Two processes over the same blobs: the pull side (on the bridge, which pods reach) refuses every write."""
    config = yaml.safe_load(registry.config(side, Path("/pki"), Path("/r/htpasswd"), Path("/data")))
    assert config["http"]["addr"] == address
    assert config["http"]["tls"] == {"certificate": "/pki/registry.crt", "key": "/pki/registry.key"}
    assert config["auth"] == {"htpasswd": {"realm": "elasticjob-local", "path": "/r/htpasswd"}}
    assert config["storage"]["filesystem"]["rootdirectory"] == "/data"
    assert config["storage"].get("maintenance", {}).get("readonly", {}).get("enabled", False) is read_only


def test_the_pull_secret_holds_the_pull_users_credentials() -> None:
    secret = registry.pull_secret("team", "s3cret")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"] == {"name": "elasticjob-registry", "namespace": "team"}
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert list(config["auths"]) == ["10.244.0.1:5000"]
    assert base64.b64decode(config["auths"]["10.244.0.1:5000"]["auth"]).decode() == "elasticjob-pull:s3cret"


def test_images_are_pushed_through_the_push_side_and_named_as_pods_pull_them(tmp_path: Path) -> None:
    from localcluster.imagebuild import push
    from localcluster.layout import Layout

    target = push.local_target(Layout(tmp_path))
    assert (target.registry, target.pulled) == ("127.0.0.1:5001/elasticjob", "10.244.0.1:5000/elasticjob")


def test_the_chart_is_installed_by_its_digest() -> None:
    from localcluster.operatorchart import Published

    chart = Published("oci://10.244.0.1:5000/elasticjob/charts/elasticjob-operator", "0.1.0", "sha256:ab")
    assert chart.pinned == "oci://10.244.0.1:5000/elasticjob/charts/elasticjob-operator:0.1.0@sha256:ab"


def test_containerd_reads_the_registry_host_with_the_cluster_ca(tmp_path: Path) -> None:
    node = plan.RealNode(0, "local-node-0", tmp_path)
    containerd = tomllib.loads(plan.containerd_config(node))
    assert containerd["plugins"]["io.containerd.grpc.v1.cri"]["registry"] == {"config_path": str(node.path("certs.d"))}
    hosts = tomllib.loads(plan.hosts_toml(registry.ADDRESS, Path("/pki/ca.crt")))
    assert hosts == {"server": "https://10.244.0.1:5000",
                     "host": {"https://10.244.0.1:5000": {"capabilities": ["pull", "resolve"], "ca": "/pki/ca.crt"}}}
