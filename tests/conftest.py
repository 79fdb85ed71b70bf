"""Fixtures for the whole suite: one cluster per session, a fresh namespace per test, an operator runner.

The cluster is the local control plane from `localcluster/` unless E2E_KUBECONFIG (or KUBECONFIG with
E2E_CLUSTER=kind) points at another one, so the same tests run on kind. Unit tests use none of this.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import OPERATOR_LOG_FAILURES, wait_for

ROOT = Path(__file__).resolve().parents[1]
try:
    from localcluster import registry as local_registry
except ImportError:  # a checkout without the local cluster's package: no local registry either
    local_registry = None
CRD_FILE = ROOT / "crds" / "elasticjob.dev_elasticjobs.yaml"
# The one version (the chart's appVersion): the images' tag.
APP_VERSION = yaml.safe_load((ROOT / "charts" / "elasticjob-operator" / "Chart.yaml").read_text())["appVersion"]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
OPERATOR_STOP_SECONDS = 30


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markers = {"integration": pytest.mark.integration, "e2e": pytest.mark.e2e}
    tests_dir = ROOT / "tests"
    for item in items:
        path = Path(str(item.path))
        if tests_dir not in path.parents:
            continue
        layer = path.relative_to(tests_dir).parts[0]
        if layer in markers:
            item.add_marker(markers[layer])


# ---------------------------------------------------------------- cluster


@dataclass(frozen=True)
class ClusterHandle:
    kubeconfig: Path
    kind: str  # "local" (started from localcluster/), "kind" (E2E_CLUSTER=kind: tests/e2e/kind/up.sh's) or "external"
    nodes: int | None = None  # the local cluster's nodes; None when external
    node_kind: str | None = None  # the local cluster's: "real" or "process"

    @property
    def kit_image(self) -> str | None:
        """The image the operator's kit comes from, where the nodes run images: as the chart sets it (on real
        local nodes, the operator's image in the local registry)."""
        if self.node_kind == "process":
            return None  # the node agent runs every container from the host's .venv: no init containers
        default = (local_registry.image("elasticjob-operator") if self.pulls_from_registry
                   else f"elasticjob-operator:{APP_VERSION}")  # as tests/e2e/kind/up.sh tags it
        return os.environ.get("E2E_KIT_IMAGE", default)

    @property
    def pulls_from_registry(self) -> bool:
        """Real local nodes pull the project's images from the local registry, with its pull secret."""
        return self.kind == "local" and self.node_kind == "real" and local_registry is not None


def _external_kubeconfig() -> Path | None:
    if path := os.environ.get("E2E_KUBECONFIG"):
        return Path(path)
    if os.environ.get("E2E_CLUSTER") == "kind":
        return Path(os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
    return None


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterHandle]:
    external = _external_kubeconfig()
    if external is not None:
        yield ClusterHandle(external, "kind" if os.environ.get("E2E_CLUSTER") == "kind" else "external")
        return
    from localcluster import controlplane

    nodes = int(os.environ.get("LOCALCLUSTER_NODES", "3"))
    # "real": kubelet, containerd, runc, CNI and kube-proxy (localcluster/realnodes); "process": the node agent,
    # which only its own tests (make test-process-nodes) and two benchmarks still use.
    kind = os.environ.get("LOCALCLUSTER_NODE_KIND", "real")
    started = controlplane.ensure_up(ROOT, nodes, node_kind=kind)
    yield ClusterHandle(started.kubeconfig, "local", started.nodes, kind)
    # A pytest-xdist worker never stops it: the other worker may still be running tests on it.
    in_xdist_worker = "PYTEST_XDIST_WORKER" in os.environ
    if started.started_now and os.environ.get("KEEP_CLUSTER") != "1" and not in_xdist_worker:
        controlplane.stop(ROOT)


@pytest.fixture(scope="session")
def kube(cluster: ClusterHandle):
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api_client
    api_client.close()


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(kube, cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, usable for pods at once (its default ServiceAccount exists, and on real local nodes the
    local registry's pull secret); deleted without waiting."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(kube)
    name = _namespace_name(request.node.name)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"elasticjob.dev/test": "true"})))
    wait_for(
        lambda: core.read_namespaced_service_account("default", name), 30,
        f"the default ServiceAccount of namespace {name}", ignore=(ApiException,),
    )
    if cluster.pulls_from_registry:
        from localcluster.layout import Layout

        core.create_namespaced_secret(name, local_registry.pull_secret(name, local_registry.password(Layout(ROOT))))
    yield name
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except ApiException as err:
        if err.status != 404:
            raise


# ---------------------------------------------------------------- CRD


def _crd_established(ext, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


@pytest.fixture(scope="session")
def crds_installed(kube) -> list[str]:
    """Server-side applies crds/elasticjob.dev_elasticjobs.yaml and waits until it is Established."""
    from kubernetes import client

    if not CRD_FILE.exists():
        pytest.fail(f"{CRD_FILE.relative_to(ROOT)} is missing: generate it with `elasticjob crd`")
    ext = client.ApiextensionsV1Api(kube)
    names = []
    for doc in yaml.safe_load_all(CRD_FILE.read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        name = doc["metadata"]["name"]
        ext.patch_custom_resource_definition(
            name, doc, field_manager="elasticjob-tests", force=True, _content_type="application/apply-patch+yaml",
        )
        wait_for(lambda: _crd_established(ext, name), 30, f"CRD {name} to be Established")
        names.append(name)
    assert names, f"no CustomResourceDefinition in {CRD_FILE}"
    return names


# ---------------------------------------------------------------- operator


@dataclass
class OperatorProcess:
    """`python -m elasticjob run` as a subprocess, the same entry the image starts."""

    proc: subprocess.Popen
    log_path: Path
    namespaces: Sequence[str]
    # A test that provokes errors on purpose sets this to False to skip the clean-log check.
    check_log: bool = True
    exit_code: int | None = field(default=None, init=False)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        def observe() -> str:
            assert self.running, f"operator exited with {self.proc.returncode}:\n{self.log_tail()}"
            return self.log_text()

        wait_for(observe, timeout, f"operator log to contain {text!r}", until=lambda log: text in log)

    def stop(self) -> int:
        """SIGTERM and wait; SIGKILLs the whole process group if it overstays, and returns the exit code."""
        if self.exit_code is not None:
            return self.exit_code
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=OPERATOR_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            # faulthandler (PYTHONFAULTHANDLER) writes every thread's stack to the log on SIGABRT: what it hung on.
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.exit_code = -signal.SIGKILL
        return self.exit_code

    def kill(self) -> None:
        """SIGKILL, as a lost node or an OOM kill would: nothing is closed or released; no clean exit expected."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.check_log, self.exit_code = False, 0

    def assert_clean_exit(self) -> None:
        code = self.stop()
        assert code == 0, f"operator exited with {code} after SIGTERM; log tail:\n{self.log_tail()}"
        if self.check_log:
            bad = [line for line in self.log_text().splitlines() if OPERATOR_LOG_FAILURES.search(line)]
            assert not bad, f"operator log shows unhandled errors ({bad[0]!r}); log tail:\n{self.log_tail()}"


def _operator_python() -> str:
    return str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable


def _from_the_chart(cluster: ClusterHandle, request: pytest.FixtureRequest, env: dict[str, str] | None) -> bool:
    """The e2e tests on real nodes and on kind run the operator from its image through its chart (E2E_OPERATOR=host: as a
    process on the host instead); so does nothing else: the soak and the integration tests kill, restart and
    read the operator as a process, a test that hands it its own credentials (env) wants the process, and one
    marked host_operator cuts off or loses a node, which might be the operator's own."""
    # On kind, the image up.sh loaded into its node.
    wanted = os.environ.get("E2E_OPERATOR", "chart" if cluster.node_kind == "real" or cluster.kind == "kind" else "host")
    in_e2e = ROOT / "tests" / "e2e" in Path(str(request.node.path)).parents
    on_host = request.node.get_closest_marker("host_operator") is not None
    return wanted == "chart" and in_e2e and env is None and not on_host and cluster.kind in ("local", "kind")


@pytest.fixture
def operator_factory(
    cluster: ClusterHandle, crds_installed: list[str], namespace: str, tmp_path: Path, kube: Any,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Any]]:
    """Starts operators (default: watching this test's namespace); all are stopped and checked at teardown."""
    started: list[Any] = []

    def start(namespaces: Sequence[str] | None = None, extra_args: Sequence[str] = (),
              env: dict[str, str] | None = None) -> Any:
        namespaces = [namespace] if namespaces is None else list(namespaces)
        if _from_the_chart(cluster, request, env):
            import chart_operator

            started.append(chart_operator.install(cluster.kubeconfig, kube, namespace, namespaces, extra_args))
            return started[-1]
        kit = ["--kit-image", cluster.kit_image] if cluster.kit_image else []
        if cluster.pulls_from_registry:
            kit += ["--image-pull-secret", local_registry.PULL_SECRET]
        argv = [_operator_python(), "-m", "elasticjob", "run", "--verbose", *kit, *extra_args]
        argv += [arg for ns in namespaces for arg in ("--namespace", ns)]
        log_path = tmp_path / f"operator-{len(started)}.log"
        full_env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONUNBUFFERED": "1",
                    "PYTHONFAULTHANDLER": "1", **(env or {})}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=ROOT, env=full_env, start_new_session=True)
        handle = OperatorProcess(proc, log_path, namespaces)
        started.append(handle)
        return handle

    yield start
    failures = []
    for handle in started:
        try:
            handle.assert_clean_exit()
        except AssertionError as err:
            failures.append(str(err))
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


@pytest.fixture
def operator(operator_factory: Callable[..., OperatorProcess]) -> OperatorProcess:
    """One operator watching this test's namespace, stopped with SIGTERM at teardown (must exit 0, clean log)."""
    return operator_factory()


@pytest.fixture
def install_rbac(kube):
    """Applies the chart's ServiceAccount and RBAC (rendered by Helm); returns the account's user name."""
    import chart_rbac

    yield from chart_rbac.install_rbac(kube)
