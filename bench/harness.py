"""What the benchmarks share: the local cluster's API, the operator as a subprocess, namespaces, waiting.

Each benchmark prints one table, measured in one run, on the local cluster (`make cluster-up` first, or
`make bench`, which starts it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from localcluster import registry
from localcluster.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
KUBECONFIG = ROOT / ".localcluster" / "kubeconfig"
STATE_DIR = ROOT / ".localcluster"
# Real local nodes pull the project's images from the local registry with its pull secret, as the e2e tests do.
WORKER_IMAGE = registry.image("elasticjob-worker", f"{registry.VERSION}-cpu")
KIT_IMAGE = registry.image("elasticjob-operator")
KIT_ARGS = ["--kit-image", KIT_IMAGE, "--image-pull-secret", registry.PULL_SECRET]  # the operator's, as the chart's
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
T = TypeVar("T")


class Api:
    def __init__(self) -> None:
        self.client = config.new_client_from_config(config_file=str(KUBECONFIG))
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)

    def connections(self, count: int) -> None:
        """Keep `count` connections: the client's pool is made when it is, with 5 per CPU by default, and a
        thread beyond them opens (and drops) a connection per request, a TLS handshake each."""
        self.client.configuration.connection_pool_maxsize = count
        self.client.rest_client = client.rest.RESTClientObject(self.client.configuration)

    def install_crd(self) -> None:
        subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), "apply", "--server-side", "--force-conflicts",
                        "-f", str(ROOT / "crds" / "elasticjob.dev_elasticjobs.yaml")], check=True, capture_output=True)
        # On a cluster just started, jobs made before the CRD is established are refused (404). (`kubectl wait`
        # fails at once while the CRD has no conditions yet.)
        extensions = client.ApiextensionsV1Api(self.client)

        def established() -> bool:
            conditions = extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait(established, 60, "the ElasticJob CRD established")

    @contextlib.contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.core.create_namespace({"metadata": {"name": name}})
        wait(lambda: _has_default_account(self.core, name), 30, f"namespace {name} ready")
        if registry.running(Layout(ROOT)):
            self.core.create_namespaced_secret(name, registry.pull_secret(name, registry.password(Layout(ROOT))))
        try:
            yield name
        finally:
            self.core.delete_namespace(name, propagation_policy="Background")

    def create_job(self, namespace: str, manifest: dict) -> dict:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)

    def status(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, name,
                                                         {"spec": {"replicas": replicas}})

    def workers(self, namespace: str, name: str) -> list:
        selector = f"elasticjob.dev/job-name={name},elasticjob.dev/role=worker"
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items


def _has_default_account(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except client.ApiException:
        return False


class Operator:
    """`python -m elasticjob run` watching all namespaces, its log in a file; stopped with SIGTERM."""

    def __init__(self, log_path: Path, extra_args: list[str] = ()):
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Operator:
        key = STATE_DIR / "bench-rendezvous.key"
        if not key.exists():
            key.write_text(secrets.token_hex(32))
        argv = [sys.executable, "-m", "elasticjob", "run", "--all-namespaces", "--rendezvous-key-file", str(key),
                *self.extra_args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         env={**os.environ, "KUBECONFIG": str(KUBECONFIG), "PYTHONUNBUFFERED": "1"},
                                         start_new_session=True)
        try:
            wait(lambda: "watches synced" in self.log_path.read_text(errors="replace"), 60, "the operator's watches")
        except BaseException:
            self.__exit__()  # a `with` whose __enter__ raised never calls __exit__: no operator left behind
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait(observe: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = observe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def median_range(values: list[float]) -> str:
    """'median [min-max] (n)' of what was measured, or '-'."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}] ({len(values)})"
