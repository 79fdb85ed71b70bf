"""The chart's admission policies for Kueue beyond the queue label: a template fixed while Kueue's admission
holds it, a queue required of every job (kueue.requireQueueName), a default queue (kueue.defaultQueueName), and
the operator flag that holds a job without a queue. Rendered by real Helm."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
from test_chart import VARIANTS, deployment, render


def named(docs: list[dict[str, Any]], kind: str, suffix: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]


def args(docs: list[dict[str, Any]]) -> list[str]:
    return list(deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"])


def test_the_template_of_an_admitted_job_is_fixed_unless_it_is_suspended() -> None:
    assert not named(render(VARIANTS["kueue-off"]), "ValidatingAdmissionPolicy", "-template-fixed-while-admitted")
    docs = render()
    (policy,) = named(docs, "ValidatingAdmissionPolicy", "-template-fixed-while-admitted")
    (binding,) = named(docs, "ValidatingAdmissionPolicyBinding", "-template-fixed-while-admitted")
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]
    assert "oldObject.status.admission.state == 'Admitted'" in spec["matchConditions"][0]["expression"]
    rule = spec["validations"][0]["expression"]
    assert "object.spec.template == oldObject.spec.template" in rule and "runPolicy.suspend" in rule
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == [
        "Deny"]


@pytest.mark.parametrize("values, policy, flag", [
    ({}, False, False),
    ({"kueue": {"requireQueueName": True}}, True, True),
    ({"kueue": {"defaultQueueName": "team-q"}}, False, True),  # a default requires a queue of the operator too
    ({"kueue": {"requireQueueName": True, "mode": "off"}}, False, False),
])
def test_a_queue_is_required_where_the_values_say(values: dict[str, Any], policy: bool, flag: bool) -> None:
    docs = render(values)
    found = named(docs, "ValidatingAdmissionPolicy", "-queue-name-required")
    assert bool(found) == policy
    assert ("--require-queue-name" in args(docs)) == flag
    if policy:
        (vap,) = found
        assert vap["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
        assert "kueue.x-k8s.io/queue-name" in vap["spec"]["validations"][0]["expression"]
        (binding,) = named(docs, "ValidatingAdmissionPolicyBinding", "-queue-name-required")
        assert binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize("suspend", [True, False])
def test_a_default_queue_labels_every_job_created_without_one(suspend: bool) -> None:
    docs = render({"kueue": {"defaultQueueName": "team-q", "suspendOnCreate": suspend}})
    (policy,) = [d for d in docs if d["kind"] == "MutatingAdmissionPolicy"]
    spec = policy["spec"]
    assert "matchConditions" not in spec  # every job: the label is added where missing
    label, *rest = [m["applyConfiguration"]["expression"] for m in spec["mutations"]]
    assert '"team-q"' in label and "object.metadata.labels['kueue.x-k8s.io/queue-name']" in label
    assert ["suspend: true" in e for e in rest] == ([True] if suspend else [])
    plain = [d for d in render() if d["kind"] == "MutatingAdmissionPolicy"][0]["spec"]
    assert plain["matchConditions"][0]["name"] == "queued" and len(plain["mutations"]) == 1


@pytest.mark.parametrize("bad", ["Team_Q", "a" * 64, "q\" || true"])
def test_a_default_queue_must_be_a_queue_name(bad: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render({"kueue": {"defaultQueueName": bad}})
    assert "/kueue/defaultQueueName" in str(raised.value)
