"""Names, labels and keys: built here and nowhere else, so that creating and finding always agree."""

from __future__ import annotations

import re
from collections.abc import Mapping

from elasticjob.models import GROUP

JOB_LABEL = f"{GROUP}/job-name"
ROLE_LABEL = f"{GROUP}/role"
INDEX_LABEL = f"{GROUP}/replica-index"
# status.restarts when the pod was created: tells a failure of the last incident from a new one.
RESTART_GENERATION_ANNOTATION = f"{GROUP}/restart-generation"
# Which making of a pod's name it is, and the operator's HMAC over job, name and that number (planner/ownership.py).
SERIAL_ANNOTATION = f"{GROUP}/serial"
MARK_ANNOTATION = f"{GROUP}/mark"
# A node tainted for every pod (--taint-bad-nodes): the taint's key, which is also the label the operator finds its
# tainted nodes by, and the annotation that says until when (elasticjob/taints.py).
UNHEALTHY_TAINT = f"{GROUP}/unhealthy"
UNHEALTHY_UNTIL_ANNOTATION = f"{GROUP}/unhealthy-until"
ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"
WORKER_CONTAINER = "worker"
RENDEZVOUS_CONTAINER = "rendezvous"
FINALIZER_PREFIX = GROUP


def job_key(namespace: str, name: str) -> tuple[str, str]:
    return (namespace, name)


def worker_pod_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def rendezvous_name(job: str) -> str:
    """The usual name of both the rendezvous pod and its Service (see in_use: either may be renamed)."""
    return f"{job}-rdzv"


# The Service of the job named group 1 (the usual name, or one renamed with a suffix, see with_suffix).
_RENDEZVOUS_SERVICE = re.compile(r"^(.+)-rdzv(?:-[a-z0-9]{5})?$")
# A name the operator takes when another object holds the usual one: a DNS label (a Service's name must be one,
# and a pod's hostname is its name cut to 63), ending in 5 random characters of generateName's alphabet.
NAME_LIMIT = 63
SUFFIX_LENGTH = 5
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# An EndpointSlice joins the Service this label names; one the endpointslice-mirroring controller made from an
# Endpoints object of the Service's name carries that controller's name.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_MANAGER_LABEL = "endpointslice.kubernetes.io/managed-by"
MIRRORING_CONTROLLER = "endpointslicemirroring-controller.k8s.io"


def job_of_rendezvous_service(service: str) -> str | None:
    """The job whose rendezvous Service has this name, if it is such a name (an EndpointSlice names only its
    Service: this is how one that names a job's Service wakes that job)."""
    found = _RENDEZVOUS_SERVICE.match(service)
    return found.group(1) if found else None


def renamed_key(kind: str, usual: str) -> str:
    """The key of status.renamed: a Pod and a Service may share a name, and only one of them be taken."""
    return f"{kind}/{usual}"


def in_use(renamed: Mapping[str, str] | None, kind: str, usual: str) -> str:
    """The name the job's object of that kind is made under: the usual one, unless an object that is not the
    job's held it when the operator asked (status.renamed records the replacement, so every reconcile and a
    restarted operator use the same one)."""
    return (renamed or {}).get(renamed_key(kind, usual), usual)


def rendezvous_service_name(job: str, renamed: Mapping[str, str] | None) -> str:
    """The name of the job's rendezvous Service now (and of the one EndpointSlice the operator writes for it)."""
    return in_use(renamed, "Service", rendezvous_name(job))


def with_suffix(name: str, suffix: str, job: str) -> str:
    """`name` (the job's name and what says which object it is) with a suffix, as a DNS label: when too long, the
    job's name is cut, not what follows it (the suffix, random per name, keeps cut names apart)."""
    rest = name[len(job):] if name.startswith(job) else ""
    head = (job if rest else name)[:max(1, NAME_LIMIT - len(rest) - SUFFIX_LENGTH - 1)]
    return f"{head}{rest}-{suffix}"


def alternate_name(name: str, uid: str) -> str:
    """A pod's name while an earlier job of the same name still holds the usual one (its pods terminating after
    `kubectl delete -f job.yaml && kubectl apply -f job.yaml`): the usual name and 5 characters of the uid."""
    return f"{name}-{uid[:5]}"


def job_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job}


def worker_labels(job: str, index: int) -> dict[str, str]:
    return {JOB_LABEL: job, ROLE_LABEL: ROLE_WORKER, INDEX_LABEL: str(index)}


def rendezvous_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job, ROLE_LABEL: ROLE_RENDEZVOUS}


def worker_selector(job: str) -> str:
    return f"{JOB_LABEL}={job},{ROLE_LABEL}={ROLE_WORKER}"
