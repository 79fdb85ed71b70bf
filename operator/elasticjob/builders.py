"""Desired Kubernetes objects for a job: worker pods, the rendezvous pod and its Service. Pure."""

from __future__ import annotations

import copy
import hashlib
import secrets
from datetime import datetime
from typing import Any

from elasticjob import kit, naming, torchrun
from elasticjob.domain import NO_PLACEMENT, JobRef, Placement, Settings
from elasticjob.models import API_VERSION, KIND
from elasticjob_store.protocol import control_port

# A lost node's pods are evicted this long after the node stops answering (Kubernetes' default is 300 s).
NODE_LOST_TOLERATION_SECONDS = 30
# torchrun's own restart budget: one it never reaches while an operator runs, which alone enforces
# maxRestarts (torch spends its budget on peers that leave, too). A backstop for when no operator runs.
AGENT_RESTART_BACKSTOP = 10000
# torchrun's agent gives its workers this long after SIGTERM before SIGKILL (not configurable: pytorch#119856).
TORCHRUN_SHUTDOWN_SECONDS = 30
DEFAULT_TERMINATION_GRACE = 30  # the kubelet's, where a pod names none
TERMINATION_MARGIN = 5  # for the agent's own exit after its workers'
# The one NetworkPolicy per namespace that fences every store in it (see network_policy).
NAMESPACE_POLICY = "elasticjob-rendezvous"
# The one per namespace around every worker in it (see worker_network_policy).
WORKER_POLICY = "elasticjob-workers"
MANAGED_BY = {"app.kubernetes.io/managed-by": "elasticjob-operator"}
# Who writes the rendezvous Service's EndpointSlice (Kubernetes' own controller leaves other managers' slices be).
ENDPOINTS_MANAGER = "elasticjob-operator"
# Pod Security "restricted" for the store pod, whatever the namespace enforces.
STORE_USER = 65532
STORE_POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
# Measured with `python -m elasticjob_store` and 4 real torchrun agents training, 24 control connections held
# open and 50 state reads: 221 MiB RSS, peak 222 MiB (torch 2.13 CPU; importing torch is nearly all of it). A CUDA
# build maps larger libraries: 1 GiB leaves room for that. Past it the store leaks, and the kubelet restarts it
# like any lost store.
STORE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
STORE_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
# What the store pod takes from the workers' template, so that it lands where they can reach it. Of `affinity`
# only nodeAffinity: the workers' pod (anti-)affinity speaks of workers, and a store carrying "no two workers on a
# node" repelled every worker from its node (seen on real nodes: a lost node's replacement stayed Pending).
SCHEDULING_FIELDS = ("nodeSelector", "affinity", "priorityClassName", "imagePullSecrets", "schedulerName")
STORE_AFFINITY = ("nodeAffinity",)
# The resolver's limits in the job's pods. torch's c10d looks up the peer's name on every socket it opens (a
# reverse lookup, only for its logs): with a cluster DNS replica on a lost node, each lookup that reached it
# waited out glibc's 5 s twice, and a lost node's survivors took 10.6 s from their start to their first step
# (measured on real nodes; with these, at most 2 s a lookup). A template's own option of the same name wins.
DNS_OPTIONS = (("timeout", "1"), ("attempts", "2"))



def quick_dns(spec: dict[str, Any]) -> None:
    """Adds DNS_OPTIONS to the pod spec's dnsConfig (in place), each unless the spec names it already."""
    config = spec.setdefault("dnsConfig", {})
    options = list(config.get("options") or [])
    named = {option.get("name") for option in options}
    config["options"] = options + [{"name": name, "value": value} for name, value in DNS_OPTIONS
                                   if name not in named]


def place(pod: dict[str, Any], placement: Placement) -> dict[str, Any]:
    """Adds the placement to a pod manifest (in place) and returns it."""
    meta, spec = pod["metadata"], pod["spec"]
    if placement.labels:
        meta["labels"] = {**meta.get("labels", {}), **dict(placement.labels)}
    if placement.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **dict(placement.node_selector)}
    if placement.tolerations:
        spec["tolerations"] = list(spec.get("tolerations") or []) + [copy.deepcopy(t) for t in placement.tolerations]
    if placement.scheduler_name:
        spec["schedulerName"] = placement.scheduler_name
    if placement.scheduling_group:
        spec["schedulingGroup"] = {"podGroupName": placement.scheduling_group}
    if placement.avoid_nodes:
        avoid_nodes(spec, placement.avoid_nodes)
    return pod


def avoid_nodes(spec: dict[str, Any], nodes: tuple[str, ...]) -> None:
    """Keeps the pod off `nodes` (in place): a required node affinity on the node's name (matchFields, not the
    hostname label, which a node may set to something else). The API server takes one value per NotIn on a
    node's field, so each node is a requirement of its own (requirements of a term all hold). A template's
    required terms are alternatives, so the exclusions are added to each of them; without any, they are the one
    term."""
    excluded = [{"key": "metadata.name", "operator": "NotIn", "values": [node]} for node in sorted(set(nodes))]
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or []), *copy.deepcopy(excluded)]} for term in terms]


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def worker_container_index(template: dict[str, Any]) -> int | None:
    containers = (template.get("spec") or {}).get("containers") or []
    for i, container in enumerate(containers):
        if container.get("name") == naming.WORKER_CONTAINER:
            return i
    return 0 if containers else None


def worker_container(template: dict[str, Any]) -> dict[str, Any] | None:
    index = worker_container_index(template)
    return None if index is None else template["spec"]["containers"][index]


def _node_lost_tolerations(existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = {t.get("key") for t in existing}
    added = [{"key": key, "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": NODE_LOST_TOLERATION_SECONDS}
             for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready") if key not in keys]
    return existing + added


def add_pull_secrets(spec: dict[str, Any], names: tuple[str, ...]) -> None:
    """The operator's pull secrets after the template's own, each once."""
    present = list(spec.get("imagePullSecrets") or [])
    known = {each.get("name") for each in present}
    added = [{"name": name} for name in names if name not in known]
    if added:
        spec["imagePullSecrets"] = present + added


def worker_pod(job: JobRef, index: int, endpoint: str, generation: int = 0,
               placement: Placement = NO_PLACEMENT, kit_image: str | None = None,
               pull_secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    template = copy.deepcopy(job.spec.template)
    meta = template.get("metadata") or {}
    spec = template["spec"]
    container = spec["containers"][worker_container_index(template)]
    # torchrun writes no error file when a worker just exits non-zero, but its last log lines name the
    # worker's exit code (the "Root Cause" block): the log tail becomes the termination message.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    container["env"] = list(container.get("env") or []) + torchrun.agent_env(
        job_name=job.name, run_id=job.uid, spec=job.spec, container=container, endpoint=endpoint,
        restart_budget=AGENT_RESTART_BACKSTOP)
    # The operator replaces failed pods itself and torchrun restarts workers in place; a kubelet restart
    # would hide failures from both.
    spec["restartPolicy"] = "Never"
    spec["tolerations"] = _node_lost_tolerations(list(spec.get("tolerations") or []))
    quick_dns(spec)
    warm = kit.warm_starts(job.spec, container, kit_image)
    grace = termination_grace(spec.get("terminationGracePeriodSeconds"), job.spec.run_policy.stop_grace_seconds,
                              guarded=warm.on)
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if warm.command is not None:
        kit.use_in_worker(spec, container, warm.command, kit.copied_from(job.spec, kit_image))
    add_pull_secrets(spec, pull_secrets)
    return place({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.worker_pod_name(job.name, index),
            "namespace": job.namespace,
            "labels": {**(meta.get("labels") or {}), **naming.worker_labels(job.name, index)},
            "annotations": {**(meta.get("annotations") or {}),
                            naming.RESTART_GENERATION_ANNOTATION: str(generation)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }, placement)


def termination_grace(template: int | None, stop_grace: int, guarded: bool) -> int | None:
    """The worker pod's terminationGracePeriodSeconds: on an eviction or a drain the kubelet's SIGTERM gives the
    agent stopGraceSeconds to have the training save at an agreed step (elasticjob_warm/evicted.py, which runs
    where torchrun runs through the kit: `guarded`), then torchrun gives its workers its own 30 s before SIGKILL;
    the kubelet must wait for both. Only the kubelet's default is raised: a grace the template sets is the
    user's word and stands (a pod whose first process ignores SIGTERM waits it out on every delete). None: leave
    the field as it is."""
    if stop_grace <= 0 or not guarded or template is not None:
        return None
    return max(DEFAULT_TERMINATION_GRACE, stop_grace + TORCHRUN_SHUTDOWN_SECONDS + TERMINATION_MARGIN)


def token_digest(token: str) -> str:
    """What the store pod is given of its control token: SHA-256, so reading the pod spec does not reveal the
    token (the operator derives the token, the store checks what it is offered against the digest)."""
    return hashlib.sha256(token.encode()).hexdigest()


def rendezvous_pod(job: JobRef, placement: Placement = NO_PLACEMENT, token: str = "",
                   kit_image: str | None = None, pull_secrets: tuple[str, ...] = (),
                   peer_check: bool = True) -> dict[str, Any]:
    """The c10d store and its control endpoint (elasticjob_store), fit for a namespace that enforces
    Pod Security "restricted", scheduled like the workers. Without a token its control endpoint refuses
    every request. `peer_check`: its port answers only the job's pods (elasticjob_store/gate.py)."""
    template_spec = job.spec.template.get("spec") or {}
    container = worker_container(job.spec.template) or {}
    rdzv, name = job.spec.rendezvous, naming.rendezvous_name(job.name)
    kit_image = kit.copied_from(job.spec, kit_image)  # spec.kit Image: the image's own elasticjob_store
    user = (template_spec.get("securityContext") or {}).get("runAsUser") or STORE_USER
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {**STORE_POD_SECURITY, "runAsUser": user, "runAsGroup": user},
        "tolerations": _node_lost_tolerations(copy.deepcopy(template_spec.get("tolerations") or [])),
        "containers": [{
            "name": naming.RENDEZVOUS_CONTAINER,
            "image": rdzv.image or container.get("image", ""),
            "command": kit.store_command(kit_image),
            "env": [{"name": "ELASTICJOB_RDZV_PORT", "value": str(rdzv.port)},
                    {"name": "ELASTICJOB_RDZV_RUN_ID", "value": job.uid},
                    {"name": "ELASTICJOB_RDZV_READ_TIMEOUT", "value": str(rdzv.read_timeout_seconds)},
                    {"name": "ELASTICJOB_RDZV_MIN_NODES", "value": str(job.spec.min_replicas)},
                    {"name": "ELASTICJOB_RDZV_MAX_NODES", "value": str(job.spec.max_replicas)},
                    {"name": "ELASTICJOB_RDZV_TOKEN_SHA256", "value": token_digest(token) if token else ""},
                    # One missed keep-alive: the store reports the agent stale and wakes the operator.
                    {"name": "ELASTICJOB_RDZV_STALE_MS",
                     "value": str(int(rdzv.keep_alive_interval_seconds * torchrun.STALE_FACTOR * 1000))},
                    {"name": "ELASTICJOB_RDZV_PEER_CHECK", "value": "1" if peer_check else "0"},
                    # A job with spares: the seats of its first round (the operator sets them from then on).
                    {"name": "ELASTICJOB_RDZV_SEATS",
                     "value": str(job.spec.desired_replicas if job.spec.spares else 0)},
                    {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
            "ports": [{"name": "rendezvous", "containerPort": rdzv.port, "protocol": "TCP"},
                      {"name": "control", "containerPort": control_port(rdzv.port), "protocol": "TCP"}],
            # Every second: the job is Running, and recovers from a lost store, once this passes. The control
            # port listens once the store's port does (elasticjob_store/main.py). Not the store's port itself:
            # the kubelet dials from the node, a stranger to the store's gate, refused every second. A connect,
            # not GET /healthz: the kernel completes it whatever the control server's connection caps.
            "readinessProbe": {"tcpSocket": {"port": control_port(rdzv.port)}, "periodSeconds": 1},
            "resources": copy.deepcopy(STORE_RESOURCES),
            "securityContext": copy.deepcopy(STORE_CONTAINER_SECURITY),
        }],
    }
    if kit_image:
        kit.add_to_pod(spec, kit_image)
        kit.mount(spec["containers"][0])
    for key in SCHEDULING_FIELDS:
        if key in template_spec:
            spec[key] = copy.deepcopy(template_spec[key])
    affinity = {k: v for k, v in (spec.pop("affinity", None) or {}).items() if k in STORE_AFFINITY}
    if affinity:
        spec["affinity"] = affinity
    quick_dns(spec)
    add_pull_secrets(spec, pull_secrets)
    return place({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job.namespace,
                     "labels": naming.rendezvous_labels(job.name), "ownerReferences": [owner_reference(job)]},
        "spec": spec,
    }, placement)


def network_policy(namespace: str, settings: Settings) -> dict[str, Any]:
    """One per namespace, around every store in it: the rendezvous port admits the namespace's ElasticJob pods,
    the control port only the operator's pods (named ports, so each job keeps its own numbers). A policy per
    job would fence no better: its "the job's pods" is a label that anyone who may create pods in the
    namespace can set. Takes effect where the network plugin enforces NetworkPolicies."""
    operator: dict[str, Any] = {"podSelector": {"matchLabels": dict(settings.operator_labels)}}
    if settings.operator_namespace:
        operator["namespaceSelector"] = {"matchLabels": {
            "kubernetes.io/metadata.name": settings.operator_namespace}}
    return _ingress_policy(NAMESPACE_POLICY, namespace, naming.ROLE_RENDEZVOUS, [
        {"from": [_job_pods()], "ports": [{"protocol": "TCP", "port": "rendezvous"}]},
        {"from": [operator], "ports": [{"protocol": "TCP", "port": "control"}]},
    ])


def worker_network_policy(namespace: str) -> dict[str, Any]:
    """One per namespace, around every worker in it: any port (rank 0's TCPStore at MASTER_PORT, the
    collectives' ports, which torch picks) admits only the namespace's ElasticJob pods. The operator never
    connects to a worker (it reads their logs through the API server), and the kubelet's probes come from the
    node, which implementations admit. Egress stays open. Other pods that must reach the workers (a metrics
    scraper) need a policy of their own that admits them: policies add up."""
    return _ingress_policy(WORKER_POLICY, namespace, naming.ROLE_WORKER, [{"from": [_job_pods()]}])


def _ingress_policy(name: str, namespace: str, role: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    """A NetworkPolicy of the namespace's pods of one role, on ingress alone."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": {"podSelector": {"matchLabels": {naming.ROLE_LABEL: role}}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }


def _job_pods() -> dict[str, Any]:
    """The namespace's ElasticJob pods: every job's, as a label is all that tells them apart (see network_policy)."""
    return {"podSelector": {"matchExpressions": [{"key": naming.JOB_LABEL, "operator": "Exists"}]}}


def rendezvous_service(job: JobRef, name: str | None = None) -> dict[str, Any]:
    """No selector: a selector routes to any ready pod with the store's labels, which anyone who may create pods
    can set. The operator writes the one endpoint itself (rendezvous_endpoints), from the store pod it made.
    `name`: naming.rendezvous_service_name (the usual name unless another object held it)."""
    port = job.spec.rendezvous.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name or naming.rendezvous_name(job.name), "namespace": job.namespace,
                     "labels": naming.job_labels(job.name), "ownerReferences": [owner_reference(job)]},
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"},
                      {"name": "control", "port": control_port(port), "targetPort": control_port(port),
                       "protocol": "TCP"}],
        },
    }


def rendezvous_endpoints(job: JobRef, store: tuple[str, str, str] | None, name: str | None = None) -> dict[str, Any]:
    """The EndpointSlice behind the rendezvous Service `name` (named as the Service): the (name, uid, ip) of the
    store pod the operator made, or no endpoint while it has none."""
    port, name = job.spec.rendezvous.port, name or naming.rendezvous_name(job.name)
    endpoints = []
    if store is not None:
        pod, uid, ip = store
        endpoints = [{"addresses": [ip], "conditions": {"ready": True},
                      "targetRef": {"kind": "Pod", "name": pod, "namespace": job.namespace, "uid": uid}}]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": job.namespace,
                     "labels": {**naming.job_labels(job.name), naming.SERVICE_NAME_LABEL: name,
                                naming.SLICE_MANAGER_LABEL: ENDPOINTS_MANAGER},
                     "ownerReferences": [owner_reference(job)]},
        "addressType": "IPv6" if store is not None and ":" in store[2] else "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "rendezvous", "port": port, "protocol": "TCP"},
                  {"name": "control", "port": control_port(port), "protocol": "TCP"}],
    }


def event(job: dict[str, Any], kind: str, reason: str, message: str, now: datetime, component: str,
          instance: str) -> dict[str, Any]:
    """A core/v1 Event about the job, as `kubectl describe ej` lists them."""
    meta = job["metadata"]
    when = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"],
                           "resourceVersion": meta.get("resourceVersion")},
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
    }
