"""What the controller observed of Kueue for one job, as the planner carries it (Observed.integrations). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elasticjob.kueue.status import AdmissionStatus, admission, set_admission
from elasticjob.kueue.workloads import FlavorView, Priority, WorkloadView, current_slice
from elasticjob.planner.base import Observed, Plan


@dataclass(frozen=True)
class KueueObserved:
    """The job's Workloads (watched: one, or its slices), the flavors by name, the priority its class gives (read
    once). kueue/admission.py's Kueue adds the decisions."""

    workloads: tuple[WorkloadView, ...] = ()
    flavors: Mapping[str, FlavorView] = field(default_factory=dict)
    priority: Priority | None = None

    @property
    def workload(self) -> WorkloadView | None:
        """The one of the job's Workloads that counts (workloads.current_slice)."""
        return current_slice(self.workloads)


NOTHING_SEEN = KueueObserved()


def of(observed: Observed) -> KueueObserved:
    """Kueue's part of what was observed (nothing, where the controller observed none)."""
    return next((i for i in observed.integrations if isinstance(i, KueueObserved)), NOTHING_SEEN)


def admission_of(plan: Plan) -> AdmissionStatus:
    """The plan's status.admission (Kueue's part of the job's status), made empty where there is none yet."""
    found = admission(plan.status)
    if found is None:
        found = AdmissionStatus()
        set_admission(plan.status, found)
    return found
