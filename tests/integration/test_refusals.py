"""Refusals by a real API server reach the user: Pod Security admission and an exhausted ResourceQuota.

Each refusal shows on the job (condition ReplicaFailure, the status message) and as a Warning Event quoting
the API server, retried with backoff; once the cause is gone, the job goes on by itself. The store pod and
the objects around it pass Pod Security "restricted" whatever the template does.
"""

from __future__ import annotations

import time

from jobapi import GROUP, PLURAL, VERSION, create, job_manifest, pods, status_of, wait_pods
from kubernetes import client

from helpers import wait_for

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000,
                        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def condition(status: dict, kind: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def refused(api, namespace: str, words: str):
    return wait_for(lambda: status_of(api, namespace, "train"), 60, f"a ReplicaFailure saying {words!r}",
                    until=lambda s: condition(s, "ReplicaFailure").get("status") == "True"
                    and words in condition(s, "ReplicaFailure").get("message", ""))


def failed_creates(api, namespace: str) -> list:
    return [e for e in api[1].list_namespaced_event(namespace).items
            if e.reason == "FailedCreate" and e.involved_object.kind == "ElasticJob"]


def test_pod_security_restricted_refuses_the_workers_not_the_store(api, namespace, operator):
    api[1].patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    create(api, namespace, job_manifest("train"))
    status = refused(api, namespace, "violates PodSecurity")
    assert "violates PodSecurity" in status["message"]
    assert pods(api, namespace, "rendezvous"), "the store pod passes 'restricted'"
    assert pods(api, namespace) == []
    event = failed_creates(api, namespace)[0]
    assert event.type == "Warning" and "violates PodSecurity" in event.message
    # The user fixes the template; the next attempt (after the backoff) goes through.
    container = job_manifest("train")["spec"]["template"]["spec"]["containers"][0]
    api[0].patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train", {"spec": {"template": {
        "spec": {"containers": [{**container, "securityContext": RESTRICTED_CONTAINER}]}}}})
    wait_pods(api, namespace, 2, timeout=90)
    wait_for(lambda: status_of(api, namespace, "train"), 60, "the refusal cleared",
             until=lambda s: condition(s, "ReplicaFailure").get("status") == "False")


def test_an_exhausted_quota_is_shown_retried_with_backoff_and_cleared(api, namespace, operator):
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"},
             "spec": {"hard": {"pods": "3"}}}
    api[1].create_namespaced_resource_quota(namespace, quota)
    wait_for(lambda: api[1].read_namespaced_resource_quota("pods", namespace).status.hard, 30,
             "the quota to be counted", until=bool)
    create(api, namespace, job_manifest("train", replicas=3))
    refused(api, namespace, "exceeded quota")
    first = len(failed_creates(api, namespace))
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started, 30, "20 s of retries", until=lambda t: t >= 20)
    retries = len(failed_creates(api, namespace)) - first
    assert 1 <= retries <= 5, f"{retries} refusals in 20 s: backoff 2, 4, 8, 15 s allows at most 4"
    assert len(pods(api, namespace)) == 2  # store + 2 workers fill the quota
    api[1].patch_namespaced_resource_quota("pods", namespace, {"spec": {"hard": {"pods": "10"}}})
    wait_pods(api, namespace, 3, timeout=120)
    wait_for(lambda: status_of(api, namespace, "train"), 60, "the refusal cleared",
             until=lambda s: condition(s, "ReplicaFailure").get("status") == "False")


def test_one_network_policy_per_namespace_and_no_token_secret(api, namespace, operator, kube):
    """Jobs of a namespace share one NetworkPolicy around their stores (and one around their workers), made by
    one create however many jobs start at once; once the namespace's last job is gone the operator deletes them
    (a policy of the same name that is not the operator's stays), and makes them again for the next job. No job
    gets a Secret: its store pod holds the token's digest."""
    networking = client.NetworkingV1Api(kube)

    def policies():
        return sorted(networking.list_namespaced_network_policy(namespace).items, key=lambda p: p.metadata.name)

    for name in ("train", "other"):
        create(api, namespace, job_manifest(name, replicas=1))
    wait_for(lambda: len(pods(api, namespace, "rendezvous")) == 2, 60, "both stores")
    policy, workers = wait_for(policies, 30, "the namespace's NetworkPolicies",
                               until=lambda seen: len(seen) == 2)
    assert policy.metadata.name == "elasticjob-rendezvous" and not policy.metadata.owner_references
    assert policy.spec.pod_selector.match_labels == {"elasticjob.dev/role": "rendezvous"}
    assert workers.metadata.name == "elasticjob-workers" and not workers.metadata.owner_references
    assert workers.spec.pod_selector.match_labels == {"elasticjob.dev/role": "worker"}
    # The one Secret there may be is the registry's pull secret that the namespace fixture makes on real nodes.
    assert [s.metadata.name for s in api[1].list_namespaced_secret(namespace).items
            if s.metadata.name != "elasticjob-registry"] == []
    store = pods(api, namespace, "rendezvous")[0]
    env = {e.name: e.value for e in store.spec.containers[0].env}
    assert len(env["ELASTICJOB_RDZV_TOKEN_SHA256"]) == 64  # the token's digest, no Secret volume (the kit's may be)
    assert not [v.name for v in store.spec.volumes or [] if v.secret or v.projected]

    delete_jobs(api, namespace, "train", "other")
    wait_for(policies, 30, "the policies deleted with the namespace's last job", until=lambda seen: not seen)
    create(api, namespace, job_manifest("third", replicas=1))
    wait_for(policies, 30, "the policies made again for the namespace's next job", until=lambda seen: len(seen) == 2)

    delete_jobs(api, namespace, "third")
    wait_for(policies, 30, "the policies deleted again", until=lambda seen: not seen)
    networking.create_namespaced_network_policy(namespace, {
        "metadata": {"name": "elasticjob-workers"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
    create(api, namespace, job_manifest("fourth", replicas=1))
    wait_for(policies, 30, "the store's policy made beside the user's", until=lambda seen: len(seen) == 2)
    delete_jobs(api, namespace, "fourth")
    wait_for(policies, 30, "only the operator's policy deleted",
             until=lambda seen: [p.metadata.name for p in seen] == ["elasticjob-workers"])


def delete_jobs(api, namespace: str, *names: str) -> None:
    for name in names:
        api[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_for(lambda: not api[0].list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"], 60,
             "the jobs gone")
