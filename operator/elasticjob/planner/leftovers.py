"""Pods and Services an earlier job of the same name left behind. Pure.

The garbage collector removes them once their owner is gone, usually within a second. But it can miss an
owner's deletion and then keep them for ever (seen in the soak around an API server restart, while the
collector's discovery failed and the restarted server still refused it by RBAC): a job created again under
that name waits on a store and workers it cannot make, since their names are taken. After a grace period the
operator removes them itself, as the collector would have: only objects whose controlling owner is another
ElasticJob uid, and only once a fresh read shows this job holds the name (so that uid is gone; see
controller/apply.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.planner.base import CollectLeftover, Event, Job, Observed, Plan

# The garbage collector's turn first: it acts within a second when it works.
LEFTOVER_GRACE = timedelta(seconds=30)


def collect_leftovers(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    if not observed.leftovers or job.created is None:
        return
    waited = now - job.created
    if waited < LEFTOVER_GRACE:
        plan.soon((LEFTOVER_GRACE - waited).total_seconds())
        return
    for left in observed.leftovers:
        plan.act(CollectLeftover(left, Event(
            "Warning", "DeletedLeftover", f"{left.kind} {left.name} belonged to an earlier job named "
            f"{job.ref.name} (uid {left.owner_uid}), which is gone; it was still here {waited.total_seconds():.0f}s "
            f"after this job was created, so the operator deleted it (the garbage collector had not)")))
