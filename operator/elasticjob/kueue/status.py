"""Kueue's part of the job's status, `status.admission`: its model, the `kubectl get` columns that show it, and
the two functions Kueue's code reads and writes it with. The core's status keeps it without reading it
(models.StatusPart); the CRD gets its schema and columns through the registry of integrations (KueueIO.status_part).
"""

from __future__ import annotations

from pydantic import Field

from elasticjob.models import ElasticJobStatus, Model, StatusPart

KEY = "admission"


class AdmissionStatus(Model):
    """Admission by Kueue, for a job labelled kueue.x-k8s.io/queue-name."""

    workload: str | None = Field(None, description="The Kueue Workload the operator made for the job.")
    cluster_queue: str | None = Field(None, description="The Kueue ClusterQueue that admitted the job.")
    state: str | None = Field(None, description="Queued, Admitted, Preempted, Evicted or Finished.")
    message: str | None = Field(None, description="Kueue's words: why it waits, or why it was evicted.")
    workers: int | None = Field(None, description="Workers admitted (podSetAssignments count): the most "
                                "that run until the job is queued again.")
    flavors: dict[str, str] | None = Field(None, description="Resource flavor per resource of the workers.")
    requested: int | None = Field(None, description="Workers asked of Kueue in a workload slice it has not "
                                  "admitted yet; the job runs `workers` until it does.")
    template_hash: str | None = Field(None, description="Hash of the spec.template the Kueue Workload was "
                                      "made from, the one its quota charges. A job whose template differs "
                                      "runs no pod of it on that admission: it is requeued with a new "
                                      "Workload.")
    last_transition_time: str | None = Field(None, description="When state last changed (RFC 3339, UTC).")


PART = StatusPart(
    KEY, AdmissionStatus, "Admission by Kueue, for a job labelled kueue.x-k8s.io/queue-name; absent otherwise.",
    columns=(
        ("Weighted", {"name": "Admission", "type": "string", "jsonPath": ".status.admission.state",
                      "description": "Kueue admission: Queued, Admitted, Preempted, Evicted, Finished (empty "
                                     "without Kueue)"}),
        ("Round", {"name": "Queue", "type": "string", "jsonPath": ".status.admission.clusterQueue", "priority": 1,
                   "description": "The ClusterQueue that admitted the job"}),
    ))


def admission(status: ElasticJobStatus) -> AdmissionStatus | None:
    """The job's admission, as read from the API (a dict, made an AdmissionStatus here once) or as last set."""
    extra = status.__pydantic_extra__
    value = extra.get(KEY) if extra is not None else None
    if isinstance(value, dict):
        value = AdmissionStatus.model_validate(value)
        setattr(status, KEY, value)
    return value if isinstance(value, AdmissionStatus) else None


def set_admission(status: ElasticJobStatus, value: AdmissionStatus | None) -> None:
    """Sets it, or clears it: a clear is written (null, which the status patch removes) only where there was one,
    so that a job Kueue never saw gets no key of Kueue's."""
    extra = status.__pydantic_extra__
    if value is None and (extra is None or extra.get(KEY) is None):
        return
    setattr(status, KEY, value)
