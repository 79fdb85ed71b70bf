"""A Kubeflow PyTorchJob (kubeflow.org/v1) as an ElasticJob that does the same. Pure: a manifest in, manifests and
warnings out; what cannot carry over is either a warning or, where the job would run differently, refused.

The field by field table, and the reasons, are in docs/migrating.md.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from elasticjob import torchrun
from elasticjob.convert import launch, selectors
from elasticjob.convert.errors import ConversionError
from elasticjob.domain import JobRef
from elasticjob.models import API_VERSION, KIND, ElasticJobSpec
from elasticjob.planner import lifecycle

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REPLICA_TYPES = ("Master", "Worker")
# What kubectl and the API server add to an object read back from a cluster: not part of the job's intent.
DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
# torch's c10d rendezvous settings (elasticPolicy.rdzvConf keys) and the spec.rendezvous fields that set them.
RDZV_CONF = {"join_timeout": "joinTimeoutSeconds", "last_call_timeout": "lastCallTimeoutSeconds",
             "close_timeout": "closeTimeoutSeconds", "keep_alive_interval": "keepAliveIntervalSeconds",
             "keep_alive_max_attempt": "keepAliveMaxAttempts", "read_timeout": "readTimeoutSeconds"}
RUN_POLICY_FIELDS = ("suspend", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "cleanPodPolicy")
# Fields the pytorch-operator's kubeflow.org/v1 kept in spec itself, which the training operator moved to runPolicy.
SPEC_RUN_POLICY = ("cleanPodPolicy", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished")
SPEC_FIELDS = frozenset({"pytorchReplicaSpecs", "elasticPolicy", "runPolicy", "nprocPerNode", *SPEC_RUN_POLICY})
# The training operator names its HorizontalPodAutoscaler as the PyTorchJob (pytorch/hpa.go), and the ElasticJob
# keeps that name: a suffix keeps the two apart while both exist.
AUTOSCALER_SUFFIX = "-elasticjob"
NAME_LIMIT = 253  # an object's name: a DNS subdomain
KUBEFLOW_MANAGER = "kubeflow.org/training-operator"
DIFFERENCES_SHOWN = 5


def convert(job: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The ElasticJob (and a HorizontalPodAutoscaler where the PyTorchJob had metrics), and the warnings."""
    spec = job.get("spec") or {}
    elastic = spec.get("elasticPolicy") or {}
    notes: list[str] = []
    run_policy = _run_policy_of(spec, notes)
    template, total, restart, worker = _pod_template(job, notes)
    out: dict[str, Any] = _size(elastic, total)
    nproc = _nproc(spec, elastic, worker, notes)
    if nproc is not None:
        out["nprocPerNode"] = nproc
    max_restarts = _max_restarts(elastic, run_policy, restart, worker.flags, notes)
    if max_restarts is not None:
        out["maxRestarts"] = max_restarts
    if rendezvous := _rendezvous(elastic, notes):
        out["rendezvous"] = rendezvous
    if policy := _run_policy(run_policy, notes):
        out["runPolicy"] = policy
    metadata = _metadata(job.get("metadata") or {})
    scheduling = _scheduling(run_policy.get("schedulingPolicy") or {}, out, metadata, template, notes)
    if scheduling:
        out["scheduling"] = scheduling
    out["template"] = template
    _validate(out)
    documents = [{"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": out}]
    if elastic.get("metrics"):
        documents.append(_autoscaler(metadata, out, elastic["metrics"], notes))
    return documents, notes


def _pod_template(job: dict[str, Any], notes: list[str]) -> tuple[dict[str, Any], int, str, launch.Launch]:
    """The template every pod runs, as this operator runs it (its worker container, the selectors of its pods);
    the number of pods, the restart policy and the worker container's launch."""
    template, total, restart = _replicas((job.get("spec") or {}).get("pytorchReplicaSpecs"))
    template, worker = launch.worker_container(template)
    notes += worker.warnings
    notes += selectors.rewrite(template.setdefault("spec", {}), (job.get("metadata") or {}).get("name"))
    if (template.get("metadata") or {}).get("creationTimestamp", "") is None:
        del template["metadata"]["creationTimestamp"]  # what `kubectl get -o yaml` prints in a template: no intent
    return template, total, restart, worker


def _run_policy_of(spec: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """runPolicy, with what the pytorch-operator's kubeflow.org/v1 kept in spec (the training operator prunes it,
    so runPolicy's own wins); any other field of spec the converter does not read is named."""
    run_policy = dict(spec.get("runPolicy") or {})
    for key in SPEC_RUN_POLICY:
        if spec.get(key) is None:
            continue
        if run_policy.get(key) is not None:
            notes.append(f"spec.{key} {spec[key]} dropped: runPolicy.{key} {run_policy[key]} is the field of the "
                         "training operator's kubeflow.org/v1")
        else:
            run_policy[key] = spec[key]
            notes.append(f"spec.{key} read as runPolicy.{key} (the pytorch-operator's kubeflow.org/v1 kept it in "
                         "spec)")
    for key in sorted(k for k, v in spec.items() if k not in SPEC_FIELDS and v is not None):
        notes.append(f"spec.{key} ignored: not a field of the PyTorchJob API (kubeflow.org/v1) the converter knows")
    return run_policy


def _replicas(specs: Any) -> tuple[dict[str, Any], int, str]:
    """The one pod template, the number of pods (Master and Workers) and the restart policy."""
    if not specs:
        raise ConversionError("spec.pytorchReplicaSpecs is empty: nothing to run")
    specs = _by_type(specs)
    master, worker = specs.get("Master"), specs.get("Worker")
    if master is not None and _count(master) != 1:
        raise ConversionError(f"Master has {_count(master)} replicas: a PyTorchJob has one Master")
    if master is not None and worker is not None:
        differences = _differences(master.get("template") or {}, worker.get("template") or {})
        if differences:
            shown = "; ".join(differences[:DIFFERENCES_SHOWN])
            more = f" (and {len(differences) - DIFFERENCES_SHOWN} more)" if len(differences) > DIFFERENCES_SHOWN else ""
            raise ConversionError(f"the Master's template differs from the Workers': {shown}{more}. An ElasticJob "
                                  "runs one template for every pod (rank 0 is whichever joins first): make them "
                                  "the same")
    present = [s for s in (master, worker) if s is not None]
    total = sum(_count(s) for s in present)
    if total < 1:
        raise ConversionError("Master and Worker have 0 replicas in all: nothing to run")
    policies = {s.get("restartPolicy") or "OnFailure" for s in present}  # OnFailure: the PyTorchJob default
    restart = next((p for p in ("Never", "ExitCode") if p in policies), policies.pop())
    return (worker or master or {}).get("template") or {}, total, restart


def _by_type(specs: dict[str, Any]) -> dict[str, Any]:
    """The replica specs under Kubeflow's names: the training operator reads a replica type in any case
    (setTypeNamesToCamelCase), so `master:` and `WORKER:` are Master and Worker."""
    unknown = sorted(k for k in specs if k.lower() not in {t.lower() for t in REPLICA_TYPES})
    if unknown:
        raise ConversionError(f"replica types {', '.join(unknown)} are not Master or Worker")
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, replica in specs.items():
        kind = next((t for t in REPLICA_TYPES if t.lower() == key.lower()), None)
        if replica is None or kind is None:
            continue
        if kind in out:
            raise ConversionError(f"replica types {written[kind]} and {key} are both {kind} (Kubeflow reads a "
                                  "replica type in any case): keep one")
        out[kind], written[kind] = replica, key
    return out


def _count(replica: dict[str, Any]) -> int:
    """A replica spec's replicas; unset or null is 1, as the training operator defaults it."""
    replicas = replica.get("replicas")
    return 1 if replicas is None else int(replicas)


def _differences(master: Any, worker: Any, path: str = "") -> list[str]:
    """Where two templates differ, as `path: Master x, Worker y`."""
    if isinstance(master, dict) and isinstance(worker, dict):
        found = []
        for key in sorted(set(master) | set(worker)):
            found += _differences(master.get(key), worker.get(key), f"{path}.{key}" if path else str(key))
        return found
    if isinstance(master, list) and isinstance(worker, list) and len(master) == len(worker):
        return [d for i, (m, w) in enumerate(zip(master, worker)) for d in _differences(m, w, f"{path}[{i}]")]
    return [] if master == worker else [f"{path}: Master {master!r}, Worker {worker!r}"]


def _size(elastic: dict[str, Any], total: int) -> dict[str, Any]:
    lo, hi = elastic.get("minReplicas"), elastic.get("maxReplicas")
    if lo is None and hi is None:
        return {"minReplicas": total, "maxReplicas": total}  # a fixed-size job
    lo, hi = int(lo if lo is not None else total), int(hi if hi is not None else total)
    if lo > hi:
        raise ConversionError(f"elasticPolicy.minReplicas {lo} is above maxReplicas {hi}")
    if not lo <= total <= hi:
        raise ConversionError(f"the job starts {total} pods (Master and Worker replicas), outside elasticPolicy's "
                              f"{lo} to {hi}: set the Worker replicas within them")
    return {"minReplicas": lo, "maxReplicas": hi, **({"replicas": total} if total != hi else {})}


def _nproc(spec: dict[str, Any], elastic: dict[str, Any], worker: launch.Launch, notes: list[str]) -> int | None:
    """nprocPerNode: an integer, or None for the default `auto`."""
    given = spec.get("nprocPerNode", elastic.get("nProcPerNode", worker.flags.get("nproc-per-node")))
    if worker.from_python:
        if given is not None and str(given) not in ("auto", "1"):
            notes.append(f"nprocPerNode {given} dropped: the plain python command ran one process per pod, and "
                         "nprocPerNode 1 keeps that; to have torchrun start more, set nprocPerNode and take the "
                         "script's own process start-up out")
        return 1
    text = "auto" if given is None else str(given)
    gpus = torchrun.requested_gpus(worker.container)
    if text in ("auto", "gpu"):
        if not gpus:
            notes.append(f"nprocPerNode {text}: torch's auto starts one process per CPU where a pod has no GPU; "
                         "the operator's auto starts one per GPU the container requests, else 1: set nprocPerNode "
                         "to a number for more")
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConversionError(f"nprocPerNode {text!r} has no equivalent: use a whole number of processes per pod, "
                              "or auto (one per GPU the container requests, else 1)")
    return int(text)


def _max_restarts(elastic: dict[str, Any], run_policy: dict[str, Any], restart: str, flags: dict[str, str],
                  notes: list[str]) -> int | None:
    backoff = run_policy.get("backoffLimit")
    if restart == "ExitCode":
        notes.append("restartPolicy ExitCode (exit codes 1-127 fail the job) does not carry over: list the codes "
                     "that should fail the job at once in failurePolicy.fatalExitCodes (64 at most)")
    if elastic.get("maxRestarts") is not None:
        if backoff is not None:
            notes.append(f"runPolicy.backoffLimit {backoff} dropped: elasticPolicy.maxRestarts is maxRestarts")
        return int(elastic["maxRestarts"])
    if restart == "Never":
        if backoff is not None:
            notes.append(f"runPolicy.backoffLimit {backoff} dropped: the training operator counts it only for "
                         "OnFailure and Always replicas; under restartPolicy Never the first failure failed the job")
        notes.append("restartPolicy Never: the job fails at the first failure (maxRestarts 0)")
        return 0
    if backoff is not None:
        return int(backoff)
    if "max-restarts" in flags:
        return _whole_flag("max-restarts", flags["max-restarts"])
    notes.append("no runPolicy.backoffLimit: the PyTorchJob restarted failed pods without limit; maxRestarts "
                 "stays at its default 3")
    return None


def _whole_flag(name: str, value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise ConversionError(f"the command's --{name} {value!r} is not a whole number")
    return int(value)


def _rendezvous(elastic: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    rendezvous: dict[str, Any] = {}
    backend = elastic.get("rdzvBackend")
    if backend not in (None, "c10d"):
        notes.append(f"rdzvBackend {backend}: replaced by the operator's c10d store (a pod per job)")
    _port(elastic, rendezvous, notes)
    for key in ("rdzvHost", "rdzvId", "standalone"):
        if elastic.get(key) not in (None, False):
            notes.append(f"elasticPolicy.{key} dropped: the operator runs the store, names it and uses the job's "
                         "UID as the rendezvous id")
    for item in elastic.get("rdzvConf") or []:
        key, value = item.get("key"), item.get("value")
        field = RDZV_CONF.get(key)
        if field is None:
            notes.append(f"elasticPolicy.rdzvConf {key}={value} dropped: the operator sets "
                         f"{', '.join(RDZV_CONF)} from spec.rendezvous (and is_host=false)")
            continue
        try:
            rendezvous[field] = int(str(value))
        except ValueError:
            raise ConversionError(f"elasticPolicy.rdzvConf {key}={value!r} is not a whole number") from None
    return rendezvous


def _port(elastic: dict[str, Any], rendezvous: dict[str, Any], notes: list[str]) -> None:
    """rdzvPort is the port of the job's own c10d store (on worker 0) only where no other host or backend is
    named; otherwise it is the port of that host or etcd server, which the job's store replaces."""
    port, host, backend = elastic.get("rdzvPort"), elastic.get("rdzvHost"), elastic.get("rdzvBackend")
    if port is None:
        return
    if host is None and backend in (None, "c10d"):
        rendezvous["port"] = int(port)
        return
    server = f"the {backend} server" if backend not in (None, "c10d") else "the rendezvous host"
    notes.append(f"elasticPolicy.rdzvPort {port} dropped: the port of {server}{f' {host}' if host else ''}, "
                 "which the job's own store replaces; that store listens on spec.rendezvous.port (default 29400)")


def _run_policy(run_policy: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    policy = {key: run_policy[key] for key in RUN_POLICY_FIELDS if run_policy.get(key) is not None}
    if "cleanPodPolicy" not in policy:
        policy["cleanPodPolicy"] = "None"
        notes.append("runPolicy.cleanPodPolicy unset: written as None, Kubeflow's default (every pod kept when the "
                     "job finishes, here the job's store pod too, until the job is deleted); this operator's "
                     "default, Running, deletes the pods still running and the store")
    manager = run_policy.get("managedBy")
    if manager not in (None, KUBEFLOW_MANAGER):
        notes.append(f"runPolicy.managedBy {manager} dropped: this operator manages every ElasticJob")
    return policy


def _scheduling(policy: dict[str, Any], spec: dict[str, Any], metadata: dict[str, Any], template: dict[str, Any],
                notes: list[str]) -> dict[str, Any]:
    """The queue becomes Kueue's label; a priority class the pods' own; a gang is the reader's choice."""
    queue = policy.get("queue")
    labels = metadata.setdefault("labels", {})
    if queue and labels.get(QUEUE_LABEL, queue) != queue:
        notes.append(f"schedulingPolicy.queue {queue} dropped: the label {QUEUE_LABEL} names "
                     f"{labels[QUEUE_LABEL]}")
    elif queue:
        labels[QUEUE_LABEL] = queue
        notes.append(f"schedulingPolicy.queue {queue} is now the label {QUEUE_LABEL}: it must name a Kueue "
                     "LocalQueue in the job's namespace, and the job waits for Kueue's admission")
    if not labels:
        del metadata["labels"]
    priority = policy.get("priorityClass")
    pod = template.setdefault("spec", {})
    if priority and pod.setdefault("priorityClassName", priority) != priority:
        notes.append(f"schedulingPolicy.priorityClass {priority} dropped: the template's priorityClassName "
                     f"{pod['priorityClassName']} stays")
    if policy.get("minResources"):
        notes.append("schedulingPolicy.minResources dropped: Kueue counts the template's requests per pod")
    scheduling = {}
    if policy.get("scheduleTimeoutSeconds") is not None:
        scheduling["scheduleTimeoutSeconds"] = int(policy["scheduleTimeoutSeconds"])
    if policy.get("minAvailable") is not None or scheduling:
        notes.append("schedulingPolicy (a gang) carries over only as scheduleTimeoutSeconds: no gang is set; "
                     f"scheduling.gang (Workload or Coscheduling, see docs/scheduling.md) binds minReplicas "
                     f"({spec['minReplicas']}) pods, where the cluster runs one")
    return scheduling


def _metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: metadata[key] for key in ("name", "generateName", "namespace") if key in metadata}
    if metadata.get("labels"):
        out["labels"] = dict(metadata["labels"])
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k not in DROPPED_ANNOTATIONS}
    if annotations:
        out["annotations"] = annotations
    return out


def _autoscaler(metadata: dict[str, Any], spec: dict[str, Any], metrics: list[Any], notes: list[str]) -> dict[str, Any]:
    if not metadata.get("name"):
        raise ConversionError("elasticPolicy.metrics needs metadata.name: the HorizontalPodAutoscaler names its job")
    name = metadata["name"][:NAME_LIMIT - len(AUTOSCALER_SUFFIX)].rstrip("-.") + AUTOSCALER_SUFFIX
    notes.append(f"elasticPolicy.metrics: written as the HorizontalPodAutoscaler {name} on the ElasticJob's scale "
                 "subresource (the training operator's own, named as the job, goes with the PyTorchJob)")
    meta = {"name": name, **({"namespace": metadata["namespace"]} if "namespace" in metadata else {})}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
            "spec": {"scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": metadata.get("name")},
                     "minReplicas": spec["minReplicas"], "maxReplicas": spec["maxReplicas"],
                     "metrics": copy.deepcopy(metrics)}}


def _validate(spec: dict[str, Any]) -> None:
    """The model's checks (types and bounds) and the operator's own before it starts a job (lifecycle.validate);
    the CEL rules on sizes hold by construction (_size)."""
    try:
        model = ElasticJobSpec.model_validate(spec)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ConversionError(f"the converted spec is not valid: {problems}") from None
    refused = lifecycle.validate(JobRef(namespace="", name="", uid="", spec=model))
    if refused:
        raise ConversionError(f"the operator would refuse the converted job: {'; '.join(refused)}")
