"""The OCI registry beside the local cluster: the CNCF distribution registry (built from distribution/go.mod by
build_addons.sh), serving the project's images and its chart as a real cluster's registry would.

Two processes serve the same blobs, as a real registry gives a cluster a credential that reads and its build
system one that writes:
- the pull side, read-only (distribution's maintenance read-only mode), on the bridge's host address
  (10.244.0.1:5000), which the real nodes reach, for the pull user `elasticjob-pull`: the credential that
  pods' pull secrets carry can pull and nothing else;
- the push side, on the host's loopback (127.0.0.1:5001), which no pod reaches, for the user `elasticjob`:
  where `make images`, the nodes' start and the chart's publishing push.
Both with TLS from the cluster's own CA (pki.py: the nodes' containerd trusts it through hosts.toml, buildah
through --cert-dir, Helm's SDK through SSL_CERT_DIR in a child process: operatorchart.in_child) and htpasswd
authentication (bcrypt, written by the htpasswd command built beside it).
Its blobs live in ~/.cache/elasticjob/registry and outlive the cluster, so a second `up` pushes nothing that is
there already; its passwords, htpasswd files, configurations and client certificates live in the cluster's state
(.localcluster/registry) and are made once, like the PKI.

Pods pull through imagePullSecrets: `pull_secret(namespace, password(layout))` is the kubernetes.io/dockerconfigjson
Secret of the pull user's credentials. An image is pushed under PUSH_REPOSITORY and pulled under REPOSITORY
(imagebuild.push.local_target: the same repository through the other door).
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
PORT = 5000
ADDRESS = f"{BRIDGE_IP}:{PORT}"
PUSH_PORT = 5001
PUSH_ADDRESS = f"127.0.0.1:{PUSH_PORT}"
# Where pods pull the project's images and `make run` installs its chart from ...
REPOSITORY = f"{ADDRESS}/elasticjob"
CHARTS = f"oci://{REPOSITORY}/charts"
# ... and where `make images` pushes them and the chart is published.
PUSH_REPOSITORY = f"{PUSH_ADDRESS}/elasticjob"
PUSH_CHARTS = f"oci://{PUSH_REPOSITORY}/charts"
USER = "elasticjob-pull"  # the pull secrets' user: it can read, never write
PUSH_USER = "elasticjob"
# The dockerconfigjson Secret the local cluster makes in `default`, the operator's namespace and each test's.
PULL_SECRET = "elasticjob-registry"
MODULE_DIR = Path(__file__).resolve().parents[1] / "distribution"
DISTRIBUTION = re.search(r"^(?:require)?\s*github\.com/distribution/distribution/v3 (v\S+)",
                         (MODULE_DIR / "go.mod").read_text(), re.M)
DISTRIBUTION_VERSION = DISTRIBUTION.group(1) if DISTRIBUTION else "unknown"
BINARY = f"registry-{DISTRIBUTION_VERSION}"
HTPASSWD = f"registry-htpasswd-{DISTRIBUTION_VERSION}"
DATA = Path(os.environ.get("ELASTICJOB_CACHE") or Path.home() / ".cache" / "elasticjob") / "registry"
SERVING = pki.ServingCert("registry", "elasticjob-registry", ("localhost",), (BRIDGE_IP, "127.0.0.1"))
READY_WITHIN = 30.0


@dataclass(frozen=True)
class Side:
    """One of the registry's two processes over the same blobs."""

    name: str  # its session's name, and its files' prefix
    address: str
    user: str
    read_only: bool


PULL = Side("registry", ADDRESS, USER, True)
PUSH = Side("registry-push", PUSH_ADDRESS, PUSH_USER, False)
SIDES = (PULL, PUSH)


def image(name: str, tag: str = VERSION) -> str:
    """A project image's reference in the local registry: `image("elasticjob-operator")`."""
    return f"{REPOSITORY}/{name}:{tag}"


@dataclass(frozen=True)
class Files:
    """What one cluster keeps of its registry, under .localcluster/registry."""

    dir: Path

    def config(self, side: Side) -> Path:
        return self.dir / f"{side.name}.yml"

    def htpasswd(self, side: Side) -> Path:
        return self.dir / f"{side.name}.htpasswd"

    def password(self, side: Side) -> Path:
        return self.dir / f"{side.name}.password"

    @property
    def certs(self) -> Path:
        """The CA alone, as buildah's --cert-dir and Go's SSL_CERT_DIR read a folder of certificates."""
        return self.dir / "certs"

    @property
    def auth(self) -> Path:
        """A Docker config.json with both sides' credentials (buildah's --authfile, Helm's registry client): the
        host's, which pushes; pods get the pull side's alone (pull_secret)."""
        return self.dir / "auth.json"


def files(layout: Layout) -> Files:
    return Files(layout.addon_dir(PULL.name))


def config(side: Side, pki_dir: Path, htpasswd: Path, data: Path) -> str:
    """distribution's configuration: TLS from the cluster's CA, htpasswd auth, blobs on the disk; the pull side
    refuses every write (distribution's maintenance read-only mode)."""
    storage: dict = {"filesystem": {"rootdirectory": str(data)}, "delete": {"enabled": True}}
    if side.read_only:
        storage["maintenance"] = {"readonly": {"enabled": True}}
    return yaml.safe_dump({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": storage,
        "http": {"addr": side.address, "tls": {"certificate": str(pki_dir / f"{SERVING.name}.crt"),
                                               "key": str(pki_dir / f"{SERVING.name}.key")}},
        "auth": {"htpasswd": {"realm": "elasticjob-local", "path": str(htpasswd)}},
    }, sort_keys=False)


def docker_config(password: str, side: Side = PULL) -> dict:
    """The `.dockerconfigjson` of a pull secret (the pull side's credentials) or of another side's."""
    auth = base64.b64encode(f"{side.user}:{password}".encode()).decode()
    return {"auths": {side.address: {"username": side.user, "password": password, "auth": auth}}}


def pull_secret(namespace: str, password: str, name: str = PULL_SECRET) -> dict:
    """The Secret of the pull side's credentials: `password` is password(layout)."""
    data = base64.b64encode(json.dumps(docker_config(password)).encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace}, "data": {".dockerconfigjson": data}}


def password(layout: Layout, side: Side = PULL) -> str:
    """A side's password: the pull side's (the pull secrets') unless told."""
    return files(layout).password(side).read_text().strip()


def _write_files(layout: Layout, bin_dir: Path) -> Files:
    """Certificate, passwords (once), htpasswd files, the auth file and configurations."""
    where = files(layout)
    where.dir.mkdir(parents=True, exist_ok=True)
    pki.ensure_pki(layout.pki)
    pki.issue_serving_cert(layout.pki, SERVING)
    auths: dict = {}
    for side in SIDES:
        if not where.password(side).exists():
            where.password(side).write_text(secrets.token_urlsafe(24) + "\n")
            where.password(side).chmod(0o600)
        secret = password(layout, side)
        line = subprocess.run([str(bin_dir / HTPASSWD), side.user], input=secret + "\n", capture_output=True,
                              text=True, check=True).stdout
        where.htpasswd(side).write_text(line)
        where.config(side).write_text(config(side, layout.pki, where.htpasswd(side), DATA))
        auths |= docker_config(secret, side)["auths"]
    where.certs.mkdir(exist_ok=True)
    shutil.copyfile(layout.pki / "ca.crt", where.certs / "ca.crt")
    where.auth.write_text(json.dumps({"auths": auths}, indent=2) + "\n")
    where.auth.chmod(0o600)
    DATA.mkdir(parents=True, exist_ok=True)
    return where


def answer(layout: Layout, auth: bool = True, timeout: float = 5, side: Side = PULL) -> int:
    """The HTTP status of a side's GET /v2/ (200 with its credentials, 401 without); 0 when nothing answers."""
    context = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    request = urllib.request.Request(f"https://{side.address}/v2/")
    if auth:
        token = base64.b64encode(f"{side.user}:{password(layout, side)}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ssl.SSLError):
        return 0


def _side_running(layout: Layout, side: Side) -> bool:
    pid = sessions.read_pid(layout, side.name)
    alive = pid is not None and sessions.ours(layout, pid)
    return alive and files(layout).password(side).exists() and answer(layout, side=side) == 200


def running(layout: Layout) -> bool:
    return all(_side_running(layout, side) for side in SIDES)


def ensure(layout: Layout, log: Log) -> Files:
    """Starts the registry's two sides unless they run and answer; returns their files. Builds the registry the
    first time (minutes)."""
    if running(layout):
        return files(layout)
    stop(layout)
    bin_dir = builds.run(layout.addons_build_script, [BINARY, HTPASSWD], "the registry", log)
    network.ensure_bridge()  # the pull side listens on the bridge's address
    where = _write_files(layout, bin_dir)
    started = time.monotonic()
    # distribution exports OpenTelemetry traces to localhost:4318 unless told not to (an error line every 5 s).
    procs = {side: sessions.start(layout, side.name, [str(bin_dir / BINARY), "serve", str(where.config(side))],
                                  env={**os.environ, "OTEL_TRACES_EXPORTER": "none"}) for side in SIDES}
    deadline = started + READY_WITHIN
    for side, proc in procs.items():
        while (status := answer(layout, side=side)) != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the registry at {side.address} does not answer (status {status}) after "
                                   f"{time.monotonic() - started:.0f}s; log tail:\n"
                                   f"{sessions.tail(layout.log_file(side.name))}")
            time.sleep(0.2)
    log(f"  registry {DISTRIBUTION_VERSION}: pulls at https://{ADDRESS} (read-only, user {USER}), pushes at "
        f"https://{PUSH_ADDRESS} (user {PUSH_USER}); TLS from the cluster's CA, blobs in {DATA} "
        f"({time.monotonic() - started:.1f}s)")
    return where


def stop(layout: Layout) -> bool:
    """Stops both sides; whether either had been started."""
    started = False
    for side in SIDES:
        pid = sessions.read_pid(layout, side.name)
        started = started or pid is not None
        if pid is not None and sessions.ours(layout, pid):
            sessions.stop_sessions([pid], 5)
        layout.pid_file(side.name).unlink(missing_ok=True)
    return started

