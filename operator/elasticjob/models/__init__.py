"""The ElasticJob API: pydantic models are the one source of truth.

The CRD schema in crds/ and the chart is generated from these classes (see crd.py); a test fails when they drift.
The v1alpha1 spec only grows by optional fields: kopf has no conversion webhooks.
"""

from elasticjob.models.base import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_FAILURES_KEPT,
    MAX_INCIDENTS_KEPT,
    MAX_NODES,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    Model,
)
from elasticjob.models.ledger import GoodputStatus, Incident, LostPhases, PlannedStop, ShortOfSize
from elasticjob.models.spec import (
    CleanPodPolicy,
    ElasticJobSpec,
    FailurePolicy,
    GangMode,
    KitSource,
    NodeCheckSpec,
    RendezvousSpec,
    RunPolicy,
    SchedulingSpec,
    StragglerSpec,
    WatchdogSpec,
)
from elasticjob.models.status import (
    AvoidedNode,
    Condition,
    ElasticJobStatus,
    FailureRecord,
    OwnedPod,
    Phase,
    RendezvousStatus,
    StatusPart,
    Straggler,
)

__all__ = [
    "API_VERSION", "AvoidedNode", "CleanPodPolicy", "Condition", "ElasticJobSpec",
    "ElasticJobStatus",
    "FailurePolicy", "FailureRecord", "GROUP", "GangMode", "GoodputStatus", "Incident", "KIND", "KitSource",
    "LostPhases", "MAX_FAILURES_KEPT", "MAX_INCIDENTS_KEPT", "MAX_NODES", "Model", "NodeCheckSpec", "OwnedPod",
    "PLURAL", "Phase",
    "PlannedStop", "RendezvousSpec", "RendezvousStatus", "RunPolicy", "SHORT_NAMES", "SINGULAR", "SchedulingSpec",
    "ShortOfSize", "StatusPart",
    "Straggler", "StragglerSpec", "VERSION", "WatchdogSpec",
]
