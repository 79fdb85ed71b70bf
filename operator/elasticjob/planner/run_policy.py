"""What `spec.runPolicy` asks of a job's life: its deadline, suspension, and what happens once it finished
(the pods cleaned as cleanPodPolicy says, the job deleted after ttlSecondsAfterFinished). Pure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob import naming
from elasticjob.models import CleanPodPolicy, Phase
from elasticjob.planner import planned_stop
from elasticjob.planner.base import DeleteJob, DeletePod, DeleteService, Job, Observed, Plan, enter_phase, since
from elasticjob.planner.scaling import stop_all


def deadline_passed(plan: Plan, job: Job, now: datetime) -> bool:
    limit = job.ref.spec.run_policy.active_deadline_seconds
    elapsed = since(plan.status.start_time, now)
    if limit is None or elapsed is None:
        return False
    if elapsed >= timedelta(seconds=limit):
        enter_phase(plan, job, Phase.FAILED, "DeadlineExceeded",
                    f"the job ran longer than activeDeadlineSeconds={limit}", now)
        return True
    plan.soon((timedelta(seconds=limit) - elapsed).total_seconds())
    return False


def suspend(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    if planned_stop.hold(plan, job, observed, "Suspend", now):
        enter_phase(plan, job, Phase.RUNNING, "Stopping", "runPolicy.suspend is true: the training saves at a "
                    "step all ranks agree on, then every pod stops", now)
        return
    stop_all(plan, observed)
    planned_stop.forget_once_gone(plan, observed)
    plan.status.start_time = None
    enter_phase(plan, job, Phase.SUSPENDED, "Suspended", "runPolicy.suspend is true: all pods stopped", now)


def finish(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    policy = job.ref.spec.run_policy
    if policy.clean_pod_policy != CleanPodPolicy.NONE:
        for pod in observed.pods:
            stop = policy.clean_pod_policy == CleanPodPolicy.ALL or pod.active or pod.role == naming.ROLE_RENDEZVOUS
            if stop and not pod.deleting:
                plan.act(DeletePod(pod.name, pod.uid))
        if observed.service is not None:
            plan.act(DeleteService(observed.service.name, observed.service.uid))
    plan.status.rendezvous.ready = False
    ttl = policy.ttl_seconds_after_finished
    elapsed = since(plan.status.completion_time, now)
    if ttl is not None and elapsed is not None:
        if elapsed >= timedelta(seconds=ttl):
            plan.act(DeleteJob())
        else:
            plan.soon((timedelta(seconds=ttl) - elapsed).total_seconds())
