"""Pod affinity terms and topology spread constraints that select pods by Kubeflow's labels, rewritten to the
labels this operator puts on a job's worker pods. Pure.

The training operator labels a PyTorchJob's pods with the job's name, their replica type (`master`, `worker`), their
index within that type and, on the Master, a role; the pytorch-operator before it used other keys for the same.
An ElasticJob's worker pods carry only `elasticjob.dev/job-name`, `elasticjob.dev/role: worker` and an index of
the operator's own (naming.worker_labels). A selector copied as it was would select none of them: a required
podAffinity leaves every pod Pending, spreading and anti-affinity do nothing.

A term is rewritten only as a whole, and only where the rewrite selects what it selected: the job's own pods (its
name, a replica type within it: every pod here is a worker), or every pod but the job's. A term that names other
PyTorchJobs is kept (it selects their pods while they run); any other is kept and named in a warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from elasticjob import naming

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
KEY_LISTS = ("matchLabelKeys", "mismatchLabelKeys")  # keys whose values come from the incoming pod's own labels
# Kubeflow's keys, current first, then the training operator's deprecated ones, then the pytorch-operator's.
JOB_KEYS = ("training.kubeflow.org/job-name", "job-name", "pytorch-job-name")
TYPE_KEYS = ("training.kubeflow.org/replica-type", "replica-type", "pytorch-replica-type")
TYPES = frozenset({"master", "worker"})  # the training operator writes replica types in lower case
# On every pod of the operator, with the value it gives a PyTorchJob's: within one job's pods, always true.
OPERATOR_LABELS = {"training.kubeflow.org/operator-name": frozenset({"pytorchjob-controller"}),
                   "group-name": frozenset({"kubeflow.org"}), "controller-name": frozenset({"pytorch-operator"})}
UNMATCHED = {  # why a key has no equivalent among an ElasticJob's labels
    **dict.fromkeys(("training.kubeflow.org/replica-index", "replica-index", "pytorch-replica-index"),
                    "no equivalent: Kubeflow numbers the pods of each replica type, the operator its workers its own "
                    "way (a replaced pod takes a new number)"),
    **dict.fromkeys(("training.kubeflow.org/job-role", "job-role"),
                    "no equivalent: Kubeflow marks its Master with it, and an ElasticJob has no Master"),
}
KUBEFLOW_KEYS = frozenset({*JOB_KEYS, *TYPE_KEYS, *OPERATOR_LABELS, *UNMATCHED})


@dataclass(frozen=True)
class Requirement:
    """One requirement of a term: a matchLabels entry (In, one value), a matchExpressions entry, or a key of
    matchLabelKeys or mismatchLabelKeys (`part` says which; no operator)."""

    part: str
    key: str
    operator: str = ""
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.part == "matchLabels":
            return f"{self.key}={self.values[0]}"
        if self.part in KEY_LISTS:
            return f"{self.part} {self.key}"
        if self.operator in ("Exists", "DoesNotExist"):
            return self.key if self.operator == "Exists" else f"!{self.key}"
        return f"{self.key} {self.operator.lower()} ({', '.join(self.values)})"


class Unmatched(Exception):
    """A requirement of Kubeflow's that selects something no label here selects."""

    def __init__(self, requirement: Requirement, why: str) -> None:
        super().__init__(f"{requirement} cannot be rewritten ({why})")


def rewrite(pod_spec: dict[str, Any], job: str | None) -> list[str]:
    """Rewrites, in place, each pod affinity term and topology spread constraint of `pod_spec` (a copy the caller
    owns) that selects by Kubeflow's labels; says what it did with each. `job`: the job's name, None if unknown."""
    notes = []
    for where, kind, term in _terms(pod_spec):
        note = _term(term, job, kind)
        if note:
            notes.append(f"{where}: {note}")
    return notes


def _terms(pod_spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(path, what kind of term, the term) for each term whose selector is of pods."""
    affinity = pod_spec.get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        section = affinity.get(kind) or {}
        path = f"template.spec.affinity.{kind}"
        for i, term in enumerate(section.get(REQUIRED) or []):
            yield f"{path}.{REQUIRED}[{i}]", f"required {kind}", term
        for i, weighted in enumerate(section.get(PREFERRED) or []):
            if weighted.get("podAffinityTerm"):
                yield f"{path}.{PREFERRED}[{i}]", f"preferred {kind}", weighted["podAffinityTerm"]
    for i, constraint in enumerate(pod_spec.get("topologySpreadConstraints") or []):
        yield f"template.spec.topologySpreadConstraints[{i}]", "spread", constraint


def _term(term: dict[str, Any], job: str | None, kind: str) -> str | None:
    """Rewrites the term in place, or leaves it; what it did, None where it has none of Kubeflow's keys."""
    requirements = _requirements(term)
    kubeflow = [r for r in requirements if r.key in KUBEFLOW_KEYS]
    if not kubeflow:
        return None
    confined = any(_names_the_job(r, job) for r in kubeflow)
    others = _other_jobs(kubeflow, job) if job is not None else None
    if not confined and others is not None:
        return (f"kept as written: it selects pods of the PyTorchJob {', '.join(others)}, not this job's, while "
                f"they run as PyTorchJobs (converted, their pods carry {naming.JOB_LABEL} instead)")
    try:
        rewritten = _rewritten(requirements, confined, job)
    except Unmatched as unmatched:
        return f"kept as written: {unmatched}; {_consequence(kind, confined)}"
    before = ", ".join(map(str, kubeflow))
    _replace(term, rewritten)
    after = ", ".join(str(r) for r in rewritten if r not in requirements)
    master = any(r.key in TYPE_KEYS and set(map(str.lower, r.values)) == {"master"} for r in kubeflow)
    said = " (it selected the Master alone: now every worker of the job, as an ElasticJob has no Master)"
    return (f"Kubeflow's pod labels rewritten to this operator's: {before} -> {after or 'nothing more'}"
            f"{said if master else ''}")


def _requirements(term: dict[str, Any]) -> list[Requirement]:
    selector = term.get("labelSelector") or {}
    found = [Requirement("matchLabels", key, "In", ("" if value is None else str(value),))
             for key, value in (selector.get("matchLabels") or {}).items()]
    found += [Requirement("matchExpressions", str(e.get("key")), str(e.get("operator")),
                          tuple(map(str, e.get("values") or ())))
              for e in selector.get("matchExpressions") or []]
    found += [Requirement(part, key) for part in KEY_LISTS for key in term.get(part) or []]
    return found


def _names_the_job(requirement: Requirement, job: str | None) -> bool:
    """Whether the requirement confines the term to this job's pods, so that a replica type is of this job."""
    if requirement.key not in JOB_KEYS:
        return False
    if requirement.part == "matchLabelKeys":  # the incoming pod's own job: this one
        return True
    return job is not None and requirement.operator == "In" and set(requirement.values) == {job}


def _other_jobs(kubeflow: list[Requirement], job: str) -> list[str] | None:
    """The other jobs the term names, where all it asks of Kubeflow's labels is to be of one of them."""
    if all(r.key in JOB_KEYS and r.operator == "In" and job not in r.values for r in kubeflow):
        return sorted({value for r in kubeflow for value in r.values})
    return None


def _rewritten(requirements: list[Requirement], confined: bool, job: str | None) -> list[Requirement]:
    """The term's requirements in this operator's labels; raises Unmatched where one has no faithful equivalent."""
    out: list[Requirement] = []
    for requirement in requirements:
        mapped = _mapped(requirement, confined, job) if requirement.key in KUBEFLOW_KEYS else requirement
        if mapped is not None and mapped not in out:
            out.append(mapped)
    if confined and not any(r.key == naming.ROLE_LABEL for r in out):
        # Kubeflow's job name selected the job's training pods; the operator's also labels the store pod.
        out.append(Requirement("matchLabels", naming.ROLE_LABEL, "In", (naming.ROLE_WORKER,)))
    return _without_overlap(out)


def _mapped(requirement: Requirement, confined: bool, job: str | None) -> Requirement | None:
    """One of Kubeflow's requirements here; None where it says nothing within the job's pods."""
    key = requirement.key
    if key in UNMATCHED:
        raise Unmatched(requirement, UNMATCHED[key])
    if key in JOB_KEYS:
        return _job_name(requirement, job)
    if not confined:
        raise Unmatched(requirement, "it selects pods of every PyTorchJob, this job's no longer among them")
    if key in TYPE_KEYS:
        return _replica_type(requirement)
    if requirement.part in KEY_LISTS or requirement.operator == "Exists" or (
            requirement.operator == "In" and set(requirement.values) <= OPERATOR_LABELS[key]):
        return None
    raise Unmatched(requirement, "it selects pods of another operator's jobs")


def _job_name(requirement: Requirement, job: str | None) -> Requirement:
    if requirement.part in KEY_LISTS:  # the incoming pod's job, whose name carries over
        return replace(requirement, key=naming.JOB_LABEL)
    if job is not None and requirement.operator in ("In", "NotIn") and set(requirement.values) == {job}:
        # In: the job's pods; NotIn: every pod but the job's (pods without the key included, as before).
        return replace(requirement, key=naming.JOB_LABEL)
    if job is None:
        raise Unmatched(requirement, "the job has no metadata.name to tell its own pods by")
    raise Unmatched(requirement, "no equivalent: it selects the pods of more jobs than this one, each under "
                    "its own operator's labels once converted")


def _replica_type(requirement: Requirement) -> Requirement:
    values = {v.lower() for v in requirement.values}
    if requirement.part == "matchLabelKeys":  # the incoming pod's replica type: every pod here is a worker
        return replace(requirement, key=naming.ROLE_LABEL)
    if requirement.operator == "Exists" or (requirement.operator == "In" and values and values <= TYPES):
        part = "matchLabels" if requirement.part == "matchLabels" else "matchExpressions"
        return Requirement(part, naming.ROLE_LABEL, "In", (naming.ROLE_WORKER,))
    why = ("no equivalent: every pod of an ElasticJob is a worker, none differs" if requirement.part in KEY_LISTS
           else "no equivalent: an ElasticJob's pods are all workers")
    raise Unmatched(requirement, why)


def _without_overlap(requirements: list[Requirement]) -> list[Requirement]:
    """The API server refuses a key both in the selector and in matchLabelKeys or mismatchLabelKeys, which two of
    Kubeflow's keys rewritten to one can make: a matchLabelKeys entry the selector pins already goes."""
    pinned = {r.key for r in requirements if r.part not in KEY_LISTS}
    lists = {part: [r.key for r in requirements if r.part == part] for part in KEY_LISTS}
    clash = pinned & set(lists["mismatchLabelKeys"]) or set(lists["matchLabelKeys"]) & set(lists["mismatchLabelKeys"])
    if clash:
        first = next(r for r in requirements if r.part == "mismatchLabelKeys" and r.key in clash)
        raise Unmatched(first, "once rewritten, it contradicts the rest of the term")
    return [r for r in requirements if not (r.part == "matchLabelKeys" and r.key in pinned)]


def _replace(term: dict[str, Any], requirements: list[Requirement]) -> None:
    """Writes the requirements back into the term, each part where it was (a part left empty goes)."""
    selector = dict(term.get("labelSelector") or {})
    labels = {r.key: r.values[0] for r in requirements if r.part == "matchLabels"}
    expressions = [{"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
                   for r in requirements if r.part == "matchExpressions"]
    for part, value in (("matchLabels", labels), ("matchExpressions", expressions)):
        selector.pop(part, None)
        if value:
            selector[part] = value
    if "labelSelector" in term or selector:
        term["labelSelector"] = selector
    for part in KEY_LISTS:
        term.pop(part, None)
        keys = [r.key for r in requirements if r.part == part]
        if keys:
            term[part] = keys


def _consequence(kind: str, confined: bool) -> str:
    labels = f"{naming.JOB_LABEL} and {naming.ROLE_LABEL} are the labels of this job's pods"
    if not confined:
        return f"it still selects PyTorchJobs' pods, and no ElasticJob's (this job's included): {labels}"
    if kind == "required podAffinity":
        return f"it matches none of this job's pods, which then stay Pending unless other pods match it: {labels}"
    return f"it matches none of this job's pods, so it no longer places them by each other: {labels}"
