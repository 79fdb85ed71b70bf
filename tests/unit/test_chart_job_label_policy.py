"""The chart's policy that reserves the pod labels the NetworkPolicies trust to the operator (jobLabelPolicy),
rendered by real Helm. What its CEL admits and refuses is checked on a real API server:
tests/integration/test_job_label_policy.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from test_chart import FULLNAME, RELEASE_NAMESPACE, VARIANTS, deployment, render

from elasticjob import builders, domain, naming

SUFFIX = "-job-labels-reserved"
OPERATOR = f"system:serviceaccount:{RELEASE_NAMESPACE}:{FULLNAME}"


def policy_and_binding(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
            and d["metadata"]["name"].endswith(SUFFIX)]


def reserved(policy: dict[str, Any]) -> set[str]:
    """The labels the policy's `touched` variable looks at: the JSON list it starts from."""
    (touched,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "touched"]
    return set(json.loads(re.match(r"(\[.*?\])\.filter\(", touched).group(1)))


def trusted_labels() -> set[str]:
    """The elasticjob.dev/ label keys the operator's NetworkPolicies select pods by."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.update(k for k in node.get("matchLabels", {}))
            found.update(e["key"] for e in node.get("matchExpressions", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for policy in (builders.network_policy("ml", domain.Settings()), builders.worker_network_policy("ml")):
        walk(policy["spec"])
    return {key for key in found if key.startswith(f"{naming.JOB_LABEL.split('/')[0]}/")}


def test_the_policy_is_on_by_default_and_refuses_pods_that_wear_the_labels() -> None:
    docs = render()
    policy, binding = policy_and_binding(docs)
    spec = policy["spec"]
    # Pods alone, not their subresources (the kubelet writes pods/status, the scheduler pods/binding).
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]
    assert spec["failurePolicy"] == "Fail"
    (validation,) = spec["validations"]
    assert validation["expression"] == "size(variables.touched) == 0" and validation["reason"] == "Forbidden"
    # The message names the labels the request touched, the fallback message all of them.
    assert "variables.touched.join(', ')" in validation["messageExpression"]
    assert naming.JOB_LABEL in validation["message"] and naming.ROLE_LABEL in validation["message"]
    for message in (validation["message"], validation["messageExpression"]):
        assert f"only the elasticjob operator ({OPERATOR}) may set" in message
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_reserved_labels_are_the_ones_the_operator_sets_and_its_network_policies_trust() -> None:
    (policy, _) = policy_and_binding(render())
    assert trusted_labels() == {naming.JOB_LABEL, naming.ROLE_LABEL}
    assert reserved(policy) == trusted_labels()
    assert reserved(policy) <= set(naming.worker_labels("j", 0)) & set(naming.rendezvous_labels("j"))


@pytest.mark.parametrize("variant, account", [
    ("default", FULLNAME),
    ("existing-account", "ops-bot"),
    ("namespaced", FULLNAME),
])
def test_the_operator_it_lets_through_is_the_deployments_service_account(variant: str, account: str) -> None:
    docs = render(VARIANTS[variant])
    (policy, _) = policy_and_binding(docs)
    assert deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == account
    (condition,) = policy["spec"]["matchConditions"]
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    assert condition == {"name": "not-the-operator", "expression": f'request.userInfo.username != "{user}"'}
    assert f"({user})" in policy["spec"]["validations"][0]["message"]


def test_a_named_account_that_the_chart_creates_is_the_one_let_through() -> None:
    (policy, _) = policy_and_binding(render({"serviceAccount": {"create": True, "name": "ej-bot"}}))
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(
        f':{RELEASE_NAMESPACE}:ej-bot"')


def test_it_binds_the_watched_namespaces_alone() -> None:
    (_, binding) = policy_and_binding(render(VARIANTS["namespaced"]))
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}}


@pytest.mark.parametrize("variant", ["default", "kueue-off", "namespaced"])
def test_the_value_turns_it_off(variant: str) -> None:
    assert len(policy_and_binding(render(VARIANTS[variant]))) == 2
    off = {**VARIANTS[variant], "jobLabelPolicy": {"enabled": False}}
    assert not policy_and_binding(render(off))
