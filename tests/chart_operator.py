"""The operator as users run it, for the e2e tests on real nodes: its image (images/operator.Dockerfile, pulled from
the local registry with the pull secret), installed by its Helm chart (real Helm, helm-python-sdk) from the same
registry as an OCI chart (`helm install oci://...`; pushed once per session) into the test's namespace and
watching only it, with the chart's ServiceAccount, RBAC and securityContext as written. Without a local registry
(process-backed nodes) the chart comes from charts/. The same handle as OperatorProcess: the
log (the operator pod's), waiting for a line, and at the end a clean log and the release uninstalled.

Only what the chart can say is asked of it: an argument it has no value for fails the test rather than run
without it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers import OPERATOR_LOG_FAILURES, wait_for

# The operator's command-line flags the e2e tests pass, as chart values.
VALUES_OF_ARGS: dict[str, dict[str, Any]] = {"--kueue": {"kueue": {"mode": "on"}},
                                             "--no-network-policy": {"networkPolicy": {"enabled": False}}}


def chart_values(namespaces: Sequence[str], extra_args: Sequence[str]) -> dict[str, Any]:
    unknown = [a for a in extra_args if a not in VALUES_OF_ARGS]
    if unknown:
        raise ValueError(f"no chart value for operator argument(s) {unknown}: add them to VALUES_OF_ARGS")
    # Both gang APIs granted: a platform team grants those its cluster runs, and the tests use both.
    values: dict[str, Any] = {"watch": {"allNamespaces": False, "namespaces": list(namespaces)},
                              "logLevel": "debug", "gangScheduling": {"workloadAPI": True, "coscheduling": True}}
    for arg in extra_args:
        values.update(VALUES_OF_ARGS[arg])
    return values


@dataclass
class ChartOperator:
    kubeconfig: Path
    namespace: str
    release: str
    core: client.CoreV1Api
    check_log: bool = True
    exit_code: int | None = field(default=None, init=False)
    _final_log: str | None = field(default=None, init=False)

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/name=elasticjob-operator,app.kubernetes.io/instance={self.release}"

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def log_text(self) -> str:
        if self._final_log is not None:
            return self._final_log
        texts = []
        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items:
            try:
                texts.append(self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace))
            except ApiException as err:
                if err.status not in (400, 404):  # not started yet, or gone
                    raise
        return "\n".join(texts)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        wait_for(self.log_text, timeout, f"operator log to contain {text!r}", until=lambda log: text in log)

    def stop(self) -> int:
        """Reads the log one last time and uninstalls the release (the Deployment's pod gets SIGTERM)."""
        if self.exit_code is not None:
            return self.exit_code
        from localcluster import operatorchart

        self._final_log = self.log_text()
        operatorchart.uninstall(self.kubeconfig, release=self.release, namespace=self.namespace)
        self.exit_code = 0
        return 0

    def assert_clean_exit(self) -> None:
        self.stop()
        if self.check_log:
            bad = [line for line in self.log_text().splitlines() if OPERATOR_LOG_FAILURES.search(line)]
            assert not bad, f"operator log shows unhandled errors ({bad[0]!r}); log tail:\n{self.log_tail()}"


_published: list[Any] = []  # the chart pushed to the local registry, once per session


def published_chart() -> Any:
    """The chart in the local registry (pushed the first time), or None where no local registry runs."""
    from localcluster import operatorchart, registry
    from localcluster.layout import Layout

    if not registry.running(Layout(operatorchart.ROOT)):
        return None
    if not _published:
        _published.append(operatorchart.publish())
    return _published[0]


def install(kubeconfig: Path, kube: Any, namespace: str, namespaces: Sequence[str],
            extra_args: Sequence[str]) -> ChartOperator:
    from localcluster import operatorchart

    release = f"ej-{secrets.token_hex(3)}"
    chart = published_chart()
    values = chart_values(namespaces, extra_args)
    if chart is not None:  # the test's namespace holds the pull secret (conftest's namespace fixture)
        values.update(operatorchart.registry_values())
    operatorchart.install_or_upgrade(kubeconfig, values, release=release, namespace=namespace, chart=chart)
    return ChartOperator(kubeconfig, namespace, release, client.CoreV1Api(kube))
