"""The OCI registry beside the local cluster: the CNCF distribution registry (built from distribution/go.mod by
build_addons.sh), serving the project's images and its chart as a real cluster's registry would.

It listens on the bridge's host address (10.244.0.1:5000), which the real nodes reach, with TLS from the
cluster's own CA (pki.py: the nodes' containerd trusts it through hosts.toml, buildah through --cert-dir, Helm's
SDK through SSL_CERT_DIR in a child process: operatorchart.in_child) and htpasswd authentication (bcrypt,
written by the htpasswd command built beside it).
Its blobs live in ~/.cache/elasticjob/registry and outlive the cluster, so a second `up` pushes nothing that is
there already; its password, htpasswd file, configuration and client certificates live in the cluster's state
(.localcluster/registry) and are made once, like the PKI.

Pods pull through imagePullSecrets: `pull_secret(namespace)` is the kubernetes.io/dockerconfigjson Secret of the
local registry's credentials.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster import builds, network, pki, sessions
from localcluster.layout import Layout
from localcluster.state import BRIDGE_IP
from localcluster.version import VERSION

Log = Callable[[str], None]
NAME = "registry"
PORT = 5000
ADDRESS = f"{BRIDGE_IP}:{PORT}"
# Where `make images` pushes the project's images and `make run` its chart.
REPOSITORY = f"{ADDRESS}/elasticjob"
CHARTS = f"oci://{REPOSITORY}/charts"
USER = "elasticjob"
# The dockerconfigjson Secret the local cluster makes in `default`, the operator's namespace and each test's.
PULL_SECRET = "elasticjob-registry"
MODULE_DIR = Path(__file__).resolve().parents[1] / "distribution"
DISTRIBUTION = re.search(r"^(?:require)?\s*github\.com/distribution/distribution/v3 (v\S+)",
                         (MODULE_DIR / "go.mod").read_text(), re.M)
DISTRIBUTION_VERSION = DISTRIBUTION.group(1) if DISTRIBUTION else "unknown"
BINARY = f"registry-{DISTRIBUTION_VERSION}"
HTPASSWD = f"registry-htpasswd-{DISTRIBUTION_VERSION}"
DATA = Path(os.environ.get("ELASTICJOB_CACHE") or Path.home() / ".cache" / "elasticjob") / "registry"
SERVING = pki.ServingCert("registry", "elasticjob-registry", ("localhost",), (BRIDGE_IP,))
READY_WITHIN = 30.0


def image(name: str, tag: str = VERSION) -> str:
    """A project image's reference in the local registry: `image("elasticjob-operator")`."""
    return f"{REPOSITORY}/{name}:{tag}"


@dataclass(frozen=True)
class Files:
    """What one cluster keeps of its registry, under .localcluster/registry."""

    dir: Path

    @property
    def config(self) -> Path:
        return self.dir / "config.yml"

    @property
    def htpasswd(self) -> Path:
        return self.dir / "htpasswd"

    @property
    def password(self) -> Path:
        return self.dir / "password"

    @property
    def certs(self) -> Path:
        """The CA alone, as buildah's --cert-dir and Go's SSL_CERT_DIR read a folder of certificates."""
        return self.dir / "certs"

    @property
    def auth(self) -> Path:
        """A Docker config.json with the credentials (buildah's --authfile, Helm's registry client)."""
        return self.dir / "auth.json"


def files(layout: Layout) -> Files:
    return Files(layout.addon_dir(NAME))


def config(pki_dir: Path, htpasswd: Path, data: Path) -> str:
    """distribution's configuration: TLS from the cluster's CA, htpasswd auth, blobs on the disk."""
    return yaml.safe_dump({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(data)}, "delete": {"enabled": True}},
        "http": {"addr": ADDRESS, "tls": {"certificate": str(pki_dir / f"{SERVING.name}.crt"),
                                          "key": str(pki_dir / f"{SERVING.name}.key")}},
        "auth": {"htpasswd": {"realm": "elasticjob-local", "path": str(htpasswd)}},
    }, sort_keys=False)


def docker_config(password: str, address: str = ADDRESS) -> dict:
    """The `.dockerconfigjson` of a pull secret (and buildah's auth file) for the registry."""
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    return {"auths": {address: {"username": USER, "password": password, "auth": auth}}}


def pull_secret(namespace: str, password: str, name: str = PULL_SECRET) -> dict:
    data = base64.b64encode(json.dumps(docker_config(password)).encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace}, "data": {".dockerconfigjson": data}}


def password(layout: Layout) -> str:
    return files(layout).password.read_text().strip()


def _write_files(layout: Layout, bin_dir: Path) -> Files:
    """Certificate, password (once), htpasswd, auth file and configuration."""
    where = files(layout)
    where.dir.mkdir(parents=True, exist_ok=True)
    pki.ensure_pki(layout.pki)
    pki.issue_serving_cert(layout.pki, SERVING)
    if not where.password.exists():
        where.password.write_text(secrets.token_urlsafe(24) + "\n")
        where.password.chmod(0o600)
    secret = password(layout)
    line = subprocess.run([str(bin_dir / HTPASSWD), USER], input=secret + "\n", capture_output=True, text=True,
                          check=True).stdout
    where.htpasswd.write_text(line)
    where.certs.mkdir(exist_ok=True)
    shutil.copyfile(layout.pki / "ca.crt", where.certs / "ca.crt")
    where.auth.write_text(json.dumps(docker_config(secret), indent=2) + "\n")
    where.auth.chmod(0o600)
    DATA.mkdir(parents=True, exist_ok=True)
    where.config.write_text(config(layout.pki, where.htpasswd, DATA))
    return where


def answer(layout: Layout, auth: bool = True, timeout: float = 5) -> int:
    """The HTTP status of GET /v2/ (200 with the credentials, 401 without); 0 when nothing answers."""
    context = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    request = urllib.request.Request(f"https://{ADDRESS}/v2/")
    if auth:
        token = base64.b64encode(f"{USER}:{password(layout)}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ssl.SSLError):
        return 0


def running(layout: Layout) -> bool:
    pid = sessions.read_pid(layout, NAME)
    alive = pid is not None and sessions.ours(layout, pid)
    return alive and files(layout).password.exists() and answer(layout) == 200


def ensure(layout: Layout, log: Log) -> Files:
    """Starts the registry unless it runs and answers; returns its files. Builds it the first time (minutes)."""
    if running(layout):
        return files(layout)
    stop(layout)
    bin_dir = builds.run(layout.addons_build_script, [BINARY, HTPASSWD], "the registry", log)
    network.ensure_bridge()  # it listens on the bridge's address
    where = _write_files(layout, bin_dir)
    started = time.monotonic()
    # distribution exports OpenTelemetry traces to localhost:4318 unless told not to (an error line every 5 s).
    proc = sessions.start(layout, NAME, [str(bin_dir / BINARY), "serve", str(where.config)],
                          env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    deadline = started + READY_WITHIN
    while (status := answer(layout)) != 200:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the registry at {ADDRESS} does not answer (status {status}) after "
                               f"{time.monotonic() - started:.0f}s; log tail:\n"
                               f"{sessions.tail(layout.log_file(NAME))}")
        time.sleep(0.2)
    log(f"  registry {DISTRIBUTION_VERSION} at https://{ADDRESS} (TLS from the cluster's CA, htpasswd user "
        f"{USER}; blobs in {DATA}) ({time.monotonic() - started:.1f}s)")
    return where


def stop(layout: Layout) -> None:
    pid = sessions.read_pid(layout, NAME)
    if pid is not None and sessions.ours(layout, pid):
        sessions.stop_sessions([pid], 5)
    layout.pid_file(NAME).unlink(missing_ok=True)

