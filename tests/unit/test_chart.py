"""The Helm chart, rendered and linted by Helm itself (Helm v4's Go SDK through helm-python-sdk, offline).

Every rendered object is checked against the Kubernetes API schemas (kubernetes-validate, strict), and
the RBAC rules against the table of what the operator really calls.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "elasticjob-operator"
RELEASE, RELEASE_NAMESPACE = "ej", "elasticjob-system"
FULLNAME = f"{RELEASE}-elasticjob-operator"
SELECTOR = f"app.kubernetes.io/name=elasticjob-operator,app.kubernetes.io/instance={RELEASE}"
# kubernetes-validate ships schemas up to 1.37; the local cluster runs 1.36.
KUBE_VERSION = "1.36"

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watch": {"allNamespaces": False, "namespaces": ["team-a", "team-b"]}},
    "one-replica": {"replicas": 1},
    "no-network-policy": {"networkPolicy": {"enabled": False}},
    "replicas-namespaced": {"replicas": 3, "watch": {"allNamespaces": False, "namespaces": ["team-a"]}},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "debug-no-metrics": {"logLevel": "debug", "metrics": {"enabled": False}},
    "existing-account": {"serviceAccount": {"create": False, "name": "ops-bot"}},
    "gangs": {"gangScheduling": {"workloadAPI": True, "coscheduling": True}},
    "kueue": {"kueue": {"mode": "on"}},
    "kueue-off": {"kueue": {"mode": "off"}},
    "kueue-namespaced": {"watch": {"allNamespaces": False, "namespaces": ["team-a"]}},
    "kueue-no-policy": {"kueue": {"suspendOnCreate": False}},
    "kueue-no-slices": {"kueue": {"workloadSlices": False}},
    "kueue-queue-required": {"kueue": {"requireQueueName": True, "defaultQueueName": "team-q"}},
    "no-kit": {"kit": {"enabled": False}},
    "kit-image": {"kit": {"image": "mirror.example/elasticjob-operator:0.1.0"}},
    "pull-secrets": {"imagePullSecrets": [{"name": "regcred"}],
                     "jobImagePullSecrets": [{"name": "regcred"}, {"name": "team"}]},
    "taint-bad-nodes": {"badNodes": {"taint": True}},
}

# What the reconciler and kopf call, per namespace it watches: (apiGroup, resource) -> verbs.
NAMESPACED_GRANTS = {
    ("elasticjob.dev", "elasticjobs"): {"get", "list", "watch", "patch", "delete"},
    ("elasticjob.dev", "elasticjobs/status"): {"patch"},
    ("", "pods"): {"get", "list", "watch", "create", "delete"},
    ("", "pods/log"): {"get"},
    ("", "services"): {"get", "list", "watch", "create", "delete"},
    ("discovery.k8s.io", "endpointslices"): {"list", "watch", "create", "patch", "delete"},
    ("", "endpoints"): {"delete"},
    ("networking.k8s.io", "networkpolicies"): {"create", "get", "delete"},
    ("", "events"): {"create"},
}
NODES_GRANT = {("", "nodes"): {"get"}}  # nothing for kopf: its scanning is off
# Only with badNodes.taint: the taint written (patch) and the sweep of the operator's tainted nodes (list).
TAINT_GRANT = {("", "nodes"): {"get", "list", "patch"}}
# Only with gangScheduling.workloadAPI / gangScheduling.coscheduling; Kueue's unless kueue.mode is off.
WORKLOAD_API_GRANTS = {("scheduling.k8s.io", "podgroups"): {"get", "create", "delete"}}
COSCHEDULING_GRANTS = {("scheduling.x-k8s.io", "podgroups"): {"get", "create", "patch"}}
KUEUE_GRANTS = {("kueue.x-k8s.io", "workloads"): {"list", "watch", "create", "patch", "delete"},
                ("kueue.x-k8s.io", "workloads/status"): {"patch"}}
KUEUE_CLUSTER_GRANTS = {("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},
                        ("kueue.x-k8s.io", "workloadpriorityclasses"): {"get"},
                        ("scheduling.k8s.io", "priorityclasses"): {"get"}}

# Kinds with no schema in kubernetes-validate: checked against the CRDs that define them instead.
CUSTOM_KINDS = {"ServiceMonitor"}
MAP_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=RELEASE_NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


LEASE_ROLE = f"{FULLNAME}-leader-election"


def watch_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Roles of the watched namespaces (not the leader election's, in the release's namespace)."""
    return [doc for doc in by_kind(docs, "Role") if doc["metadata"]["name"] != LEASE_ROLE]


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = by_kind(docs, "Deployment")
    return found


def grants(roles: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs granted by any rule without resourceNames."""
    table: dict[tuple[str, str], set[str]] = {}
    for role in roles:
        for rule in role["rules"]:
            if rule.get("resourceNames"):
                continue
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


def named_grants(roles: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {(group, resource, name, verb)
            for role in roles for rule in role["rules"] if rule.get("resourceNames")
            for group in rule["apiGroups"] for resource in rule["resources"]
            for name in rule["resourceNames"] for verb in rule["verbs"]}


# ---------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_passes_strict(variant: str) -> None:
    report = helm.lint(CHART, VARIANTS[variant], strict=True, namespace=RELEASE_NAMESPACE,
                       kube_version=f"v{KUBE_VERSION}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["total_charts_linted"] == 1
    assert not problems and not report["errors"], report


def test_helm_lint_reports_a_broken_template(tmp_path: Path) -> None:
    """The lint test above can fail: the same call on a chart with a template error reports it."""
    broken = tmp_path / "elasticjob-operator"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata:\n  name: {{ .Values.nope.deeper }}\n")
    report = helm.lint(broken, strict=True)
    assert [m for m in report["messages"] if m["severity"] == 3], report


@pytest.mark.parametrize("bad_values, where", [
    ({"replicas": "two"}, "/replicas"),
    ({"replicas": 0}, "/replicas"),
    ({"watch": {"allNamespaces": False, "namespaces": []}}, "/watch"),
    ({"watch": {"allNamespaces": True, "namespaces": ["team-a"]}}, "/watch"),
    ({"watch": {"allNamespaces": False, "namespaces": ["Not_A_Namespace"]}}, "/watch/namespaces/0"),
    ({"logLevel": "trace"}, "/logLevel"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"replica": 2}, "replica"),
], ids=lambda v: str(v))
def test_values_schema_rejects_through_helm(bad_values: dict[str, Any], where: str) -> None:
    """Helm validates values.schema.json on every render (install, upgrade, template) and refuses."""
    with pytest.raises(helm.HelmValuesError) as raised:
        render(bad_values)
    message = str(raised.value)
    assert "schema" in message and where in message, message


@pytest.mark.parametrize("variant", VARIANTS)
def test_values_schema_accepts_the_variants(variant: str) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.merge_values(VARIANTS[variant]))


# ---------------------------------------------------------------- rendered objects


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_match_kubernetes_schemas(variant: str) -> None:
    docs = render(VARIANTS[variant])
    checked = 0
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {err.message} at {list(err.path)}")
        checked += 1
    assert checked >= 6, [d["kind"] for d in docs]


def test_custom_kinds_are_served_by_a_crd_the_cluster_will_have() -> None:
    """A ServiceMonitor needs prometheus-operator's CRD; the chart's crds/ hold the ElasticJob's alone."""
    assert sorted(path.name for path in (CHART / "crds").glob("*.yaml")) == ["elasticjob.dev_elasticjobs.yaml"]
    (monitor,) = by_kind(render(VARIANTS["servicemonitor"]), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_chart_crds_validate_as_crds() -> None:
    for path in (CHART / "crds").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_chart_crd_is_a_byte_identical_copy_of_the_generated_one() -> None:
    generated = ROOT / "crds" / "elasticjob.dev_elasticjobs.yaml"
    copy = CHART / "crds" / "elasticjob.dev_elasticjobs.yaml"
    assert copy.read_bytes() == generated.read_bytes(), "chart CRD drifted from crds/: run `make crds`"


# The kit's init container comes from the operator's own image by default.
KIT = ["--kit-image", "elasticjob-operator:0.1.0"]
# The chart always elects a leader, on a Lease named after the release.
LEADER = ["--leader-elect", "--leader-lease-name", FULLNAME]


@pytest.mark.parametrize("variant, expected_args", [
    ("default", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                 "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--operator-selector", SELECTOR]),
    ("namespaced", ["--namespace", "team-a", "--namespace", "team-b", "--liveness",
                    "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER, "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--operator-selector", SELECTOR]),
    ("one-replica", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                     "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--operator-selector", SELECTOR]),
    ("debug-no-metrics", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", *LEADER, "--verbose",
                          "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--operator-selector", SELECTOR]),
    ("no-network-policy", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                           "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", "--no-network-policy", *KIT, "--operator-selector", SELECTOR]),
    ("kueue", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
               "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", "--kueue", "on", *KIT, "--operator-selector", SELECTOR]),
    ("kueue-no-slices", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                         "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", "--kueue-slices", "off", *KIT,
                         "--operator-selector", SELECTOR]),
    ("gangs", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
               "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--operator-selector", SELECTOR]),
    ("no-kit", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", "--operator-selector", SELECTOR]),
    ("pull-secrets", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                      "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--image-pull-secret", "regcred",
                      "--image-pull-secret", "team", "--operator-selector", SELECTOR]),
    ("kit-image", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090", *LEADER,
                   "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", "--kit-image",
                   "mirror.example/elasticjob-operator:0.1.0", "--operator-selector", SELECTOR]),
    ("taint-bad-nodes", ["--all-namespaces", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9090",
                         *LEADER, "--rendezvous-key-file", "/etc/elasticjob/rendezvous/key", *KIT, "--taint-bad-nodes",
                         "--operator-selector", SELECTOR]),
])
def test_operator_arguments(variant: str, expected_args: list[str]) -> None:
    (container,) = deployment(render(VARIANTS[variant]))["spec"]["template"]["spec"]["containers"]
    assert container["args"] == expected_args


def test_a_digest_pins_the_operator_and_the_kit_it_copies_into_job_pods() -> None:
    digest = "sha256:" + "ab" * 32
    (container,) = deployment(render({"image": {"digest": digest}}))["spec"]["template"]["spec"]["containers"]
    pinned = f"elasticjob-operator:0.1.0@{digest}"
    assert container["image"] == pinned
    assert container["args"][container["args"].index("--kit-image") + 1] == pinned


def test_the_operator_pod_admits_its_probe_and_metrics_ports_alone() -> None:
    (policy,) = [p for p in by_kind(render(), "NetworkPolicy")]
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment(render())["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": "health"}]},
                                         {"ports": [{"protocol": "TCP", "port": "metrics"}]}]
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    (scoped,) = by_kind(render({"metrics": {"allowFrom": prometheus}}), "NetworkPolicy")
    assert scoped["spec"]["ingress"][1]["from"] == prometheus
    assert not by_kind(render(VARIANTS["no-network-policy"]), "NetworkPolicy")


def test_deployment_probe_security_and_rollout() -> None:
    docs = render()
    spec = deployment(docs)["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert (probe["path"], ports[probe["port"]]) == ("/healthz", 8080)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["serviceAccountName"] == FULLNAME
    assert container["image"] == "elasticjob-operator:0.1.0"
    # A new pod (waiting on the Lease) starts before an old one stops: an upgrade never drops both.
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert not by_kind(docs, "ServiceMonitor")
    assert not by_kind(render(VARIANTS["debug-no-metrics"]), "Service")


def test_the_rendezvous_key_is_a_secret_mounted_into_the_operator() -> None:
    docs = render()
    (secret,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == f"{FULLNAME}-rendezvous-key"]
    assert len(base64.b64decode(secret["data"]["key"])) == 48
    # Helm leaves it on uninstall: a reinstall adopts it and still drives the stores of running jobs.
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pod = deployment(docs)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "rendezvous-key")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_without_network_policies_the_operator_may_not_create_them() -> None:
    docs = render(VARIANTS["no-network-policy"])
    assert ("networking.k8s.io", "networkpolicies") not in grants(by_kind(docs, "ClusterRole"))


# ---------------------------------------------------------------- RBAC


@pytest.mark.parametrize("variant", VARIANTS)
def test_rbac_has_no_wildcards_and_reads_no_secrets(variant: str) -> None:
    for role in [d for d in render(VARIANTS[variant]) if d["kind"] in ("Role", "ClusterRole")]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"], rule  # a store pod holds its token's digest
            assert not rule.get("nonResourceURLs"), rule


def test_rbac_cluster_wide_grants_exactly_the_table() -> None:
    docs = render()
    assert not watch_roles(docs)
    assert grants(by_kind(docs, "ClusterRole")) == {**NAMESPACED_GRANTS, **KUEUE_GRANTS, **NODES_GRANT, **KUEUE_CLUSTER_GRANTS}
    assert named_grants(by_kind(docs, "ClusterRole")) == set()
    bound = {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")
             if b["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}]}
    assert bound == {r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")}


def test_rbac_namespaced_grants_the_table_in_each_listed_namespace_only() -> None:
    docs = render(VARIANTS["namespaced"])
    assert grants(by_kind(docs, "ClusterRole")) == {**NODES_GRANT, **KUEUE_CLUSTER_GRANTS}
    roles = {r["metadata"]["namespace"]: r for r in watch_roles(docs)}
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        assert grants([role]) == {**NAMESPACED_GRANTS, **KUEUE_GRANTS}
    bindings = {b["metadata"]["namespace"]: b["roleRef"] for b in by_kind(docs, "RoleBinding")
                if b["roleRef"]["name"] != LEASE_ROLE}
    assert bindings == {ns: {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FULLNAME}
                        for ns in roles}


LEASE_GRANTS = {("coordination.k8s.io", "leases", FULLNAME, "get"), ("coordination.k8s.io", "leases", FULLNAME, "update")}


@pytest.mark.parametrize("variant", ["default", "namespaced", "one-replica", "existing-account"])
def test_leader_election_may_create_its_lease_and_read_and_renew_only_that_one(variant: str) -> None:
    docs = render(VARIANTS[variant])
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == LEASE_ROLE]
    assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert grants([role]) == {("coordination.k8s.io", "leases"): {"create"}}
    assert named_grants([role]) == LEASE_GRANTS
    everything_else = [r for r in [*by_kind(docs, "Role"), *by_kind(docs, "ClusterRole")] if r is not role]
    assert not any(group == "coordination.k8s.io" for r in everything_else for rule in r["rules"]
                   for group in rule["apiGroups"])
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] == LEASE_ROLE]
    account = deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}]


def test_the_defaults_run_two_replicas_that_a_drain_never_takes_both_of() -> None:
    docs = render()
    spec = deployment(docs)["spec"]
    assert spec["replicas"] == 2
    (budget,) = by_kind(docs, "PodDisruptionBudget")
    assert budget["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
    assert spec["template"]["metadata"]["labels"].items() >= spec["selector"]["matchLabels"].items()
    assert "--leader-elect" in spec["template"]["spec"]["containers"][0]["args"]
    # One replica: a budget of 1 would block every node drain.
    assert not by_kind(render(VARIANTS["one-replica"]), "PodDisruptionBudget")
    assert len(by_kind(render(VARIANTS["replicas-namespaced"]), "PodDisruptionBudget")) == 1


def test_existing_service_account_is_bound_not_created() -> None:
    docs = render(VARIANTS["existing-account"])
    assert not by_kind(docs, "ServiceAccount")
    assert deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "ops-bot"
    subjects = [s for b in by_kind(docs, "ClusterRoleBinding") for s in b["subjects"]]
    assert subjects and all(s["name"] == "ops-bot" for s in subjects)


# ---------------------------------------------------------------- gangs and Kueue


def test_rbac_gang_grants_each_api_only_when_enabled() -> None:
    both = grants(by_kind(render(VARIANTS["gangs"]), "ClusterRole"))
    assert both == {**NAMESPACED_GRANTS, **KUEUE_GRANTS, **NODES_GRANT, **KUEUE_CLUSTER_GRANTS, **WORKLOAD_API_GRANTS, **COSCHEDULING_GRANTS}
    one = grants(by_kind(render({"gangScheduling": {"workloadAPI": True, "coscheduling": False}}), "ClusterRole"))
    assert one == {**NAMESPACED_GRANTS, **KUEUE_GRANTS, **NODES_GRANT, **KUEUE_CLUSTER_GRANTS, **WORKLOAD_API_GRANTS}
    other = grants(by_kind(render({"gangScheduling": {"workloadAPI": False, "coscheduling": True}}), "ClusterRole"))
    assert other == {**NAMESPACED_GRANTS, **KUEUE_GRANTS, **NODES_GRANT, **KUEUE_CLUSTER_GRANTS, **COSCHEDULING_GRANTS}


def test_rbac_kueue_grants_workloads_per_namespace_and_flavors_cluster_wide() -> None:
    cluster = render(VARIANTS["kueue"])
    assert grants(by_kind(cluster, "ClusterRole")) == {**NAMESPACED_GRANTS, **NODES_GRANT, **KUEUE_GRANTS,
                                                       **KUEUE_CLUSTER_GRANTS}
    namespaced = render(VARIANTS["kueue-namespaced"])
    (role,) = watch_roles(namespaced)
    assert grants([role]) == {**NAMESPACED_GRANTS, **KUEUE_GRANTS}
    assert grants(by_kind(namespaced, "ClusterRole")) == {**NODES_GRANT, **KUEUE_CLUSTER_GRANTS}


def test_rbac_nodes_may_be_tainted_only_with_the_value() -> None:
    cluster = render(VARIANTS["taint-bad-nodes"])
    assert grants(by_kind(cluster, "ClusterRole")) == {**NAMESPACED_GRANTS, **KUEUE_GRANTS, **KUEUE_CLUSTER_GRANTS,
                                                       **TAINT_GRANT}
    namespaced = render({**VARIANTS["taint-bad-nodes"], **VARIANTS["namespaced"]})
    assert grants(by_kind(namespaced, "ClusterRole")) == {**KUEUE_CLUSTER_GRANTS, **TAINT_GRANT}
    assert all(("", "nodes") not in grants([role]) for role in watch_roles(namespaced))
    assert grants(by_kind(render(), "ClusterRole"))[("", "nodes")] == {"get"}


def test_rbac_kueue_off_grants_nothing_of_kueue() -> None:
    assert grants(by_kind(render(VARIANTS["kueue-off"]), "ClusterRole")) == {**NAMESPACED_GRANTS, **NODES_GRANT}


def test_kueue_policy_creates_queued_jobs_suspended_unless_kueue_is_off() -> None:
    assert not [d for d in render(VARIANTS["kueue-off"]) if d["kind"] in MAP_KINDS]
    assert not [d for d in render(VARIANTS["kueue-no-policy"]) if d["kind"] in MAP_KINDS]
    policy, binding = (next(d for d in render() if d["kind"] == kind)
                       for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"))
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"] == [{"apiGroups": ["elasticjob.dev"], "apiVersions": ["v1alpha1"],
                                                         "operations": ["CREATE"], "resources": ["elasticjobs"]}]
    assert "kueue.x-k8s.io/queue-name" in spec["matchConditions"][0]["expression"]
    assert "suspend: true" in spec["mutations"][0]["applyConfiguration"]["expression"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and "matchResources" not in binding["spec"]
    (scoped,) = [d for d in render(VARIANTS["kueue-namespaced"]) if d["kind"] == "MutatingAdmissionPolicyBinding"]
    assert scoped["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]


@pytest.mark.parametrize("api, expected", [
    ("", "admissionregistration.k8s.io/v1"),  # helm template without a cluster: Helm's own version, 1.36
    ("v1", "admissionregistration.k8s.io/v1"),
    ("v1beta1", "admissionregistration.k8s.io/v1beta1"),  # 1.34 and 1.35 with the beta API enabled
    ("none", None),  # 1.33, or 1.34 and 1.35 without it: the operator suspends queued jobs itself
])
def test_kueue_policy_takes_the_api_version_the_cluster_serves(api: str, expected: str | None) -> None:
    found = {d["apiVersion"] for d in render({"kueue": {"suspendOnCreateAPI": api}}) if d["kind"] in MAP_KINDS}
    assert found == ({expected} if expected else set())


VAP_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_kueue_policy_keeps_the_queue_label_of_running_jobs_unless_kueue_is_off() -> None:
    assert not [d for d in render(VARIANTS["kueue-off"]) if d["kind"] in VAP_KINDS
                and not d["metadata"]["name"].endswith("-job-labels-reserved")]  # the job label's: not Kueue's
    policy, binding = (next(d for d in render() if d["kind"] == kind and d["metadata"]["name"].endswith(
        "-queue-label-immutable")) for kind in sorted(VAP_KINDS))
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == [
        "Deny"]
    (scoped,) = [d for d in render(VARIANTS["kueue-namespaced"]) if d["kind"] == "ValidatingAdmissionPolicyBinding"
                 and d["metadata"]["name"].endswith("-queue-label-immutable")]
    assert scoped["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]


@pytest.mark.parametrize("bad_values, where", [
    ({"kueue": {"mode": "yes"}}, "/kueue/mode"),
    ({"gangScheduling": {"coschedulng": True}}, "gangScheduling"),
], ids=lambda v: str(v))
def test_values_schema_rejects_bad_gang_and_kueue_values(bad_values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render(bad_values)
    assert "schema" in str(raised.value) and where in str(raised.value), str(raised.value)


def test_an_existing_rendezvous_key_secret_replaces_the_charts_own() -> None:
    # Under `helm template` lookup finds nothing, so the chart's own key is new on every render.
    first, second = render(), render()
    keys = [next(d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-rendezvous-key"))
            ["data"]["key"] for docs in (first, second)]
    assert keys[0] != keys[1]
    docs = render({"rendezvousKey": {"existingSecret": "my-key"}})
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-rendezvous-key")]
    volume = next(v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "rendezvous-key")
    assert volume["secret"]["secretName"] == "my-key"
