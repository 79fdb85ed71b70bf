"""Decisions, pure: from a job and what was observed, the next status and the actions that get there.

Split by concern: base (what a plan is made of), lifecycle (phases, start, success, suspension, the end),
failures (what each failure costs), leftovers (what an earlier job of the name left), rendezvous (the store and
its Service), ownership (which pods the operator made), recovery (nudging the store on evidence), scaling (which
pods). The integrations' decisions are in their own packages (elasticjob.kueue, elasticjob.gang), behind
base.Integration; lifecycle calls them through Observed.integrations and names none.
"""

from elasticjob.planner.base import (
    RESYNC_SECONDS,
    UNGATED,
    Action,
    Allowance,
    ApplyObject,
    CollectLeftover,
    ControlAddress,
    CreateObject,
    DefaultReplicas,
    DeleteJob,
    DeleteObject,
    DeletePod,
    DeleteService,
    Event,
    Integration,
    IntegrationAction,
    Job,
    Leftover,
    NameTaken,
    Observed,
    Plan,
    RoundFailure,
    SetSuspend,
    StoreAction,
    TaintNode,
    UntaintNode,
    spec_changes,
)
from elasticjob.planner.lifecycle import plan, reject, validate
from elasticjob.planner.ownership import admit, service_admitted
from elasticjob.planner.recovery import suspect_nodes
from elasticjob.planner.scaling import stuck_nodes

__all__ = [
    "RESYNC_SECONDS", "UNGATED", "Action", "Allowance", "ApplyObject", "CollectLeftover", "ControlAddress",
    "CreateObject",
    "DefaultReplicas", "DeleteJob", "DeleteObject", "DeletePod", "DeleteService", "Event", "Integration",
    "IntegrationAction", "Job", "Leftover", "NameTaken", "Observed", "Plan", "RoundFailure",
    "SetSuspend", "StoreAction", "TaintNode", "UntaintNode",
    "admit", "plan", "reject", "service_admitted", "spec_changes", "stuck_nodes", "suspect_nodes", "validate",
]
