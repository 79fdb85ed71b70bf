"""The local registry's files and the nodes' containerd configuration for it (pure parts)."""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path

import yaml

from localcluster import registry
from localcluster.realnodes import plan


def test_the_registry_serves_tls_of_the_cluster_ca_with_htpasswd_on_the_bridge() -> None:
    config = yaml.safe_load(registry.config(Path("/pki"), Path("/r/htpasswd"), Path("/data")))
    assert config["http"]["addr"] == "10.244.0.1:5000"
    assert config["http"]["tls"] == {"certificate": "/pki/registry.crt", "key": "/pki/registry.key"}
    assert config["auth"] == {"htpasswd": {"realm": "elasticjob-local", "path": "/r/htpasswd"}}
    assert config["storage"]["filesystem"]["rootdirectory"] == "/data"


def test_the_pull_secret_holds_the_registry_credentials() -> None:
    secret = registry.pull_secret("team", "s3cret")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"] == {"name": "elasticjob-registry", "namespace": "team"}
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = config["auths"]["10.244.0.1:5000"]
    assert base64.b64decode(entry["auth"]).decode() == "elasticjob:s3cret"


def test_containerd_reads_the_registry_host_with_the_cluster_ca(tmp_path: Path) -> None:
    node = plan.RealNode(0, "local-node-0", tmp_path)
    containerd = tomllib.loads(plan.containerd_config(node))
    assert containerd["plugins"]["io.containerd.grpc.v1.cri"]["registry"] == {"config_path": str(node.path("certs.d"))}
    hosts = tomllib.loads(plan.hosts_toml(registry.ADDRESS, Path("/pki/ca.crt")))
    assert hosts == {"server": "https://10.244.0.1:5000",
                     "host": {"https://10.244.0.1:5000": {"capabilities": ["pull", "resolve"], "ca": "/pki/ca.crt"}}}
