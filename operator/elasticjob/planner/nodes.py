"""Nodes the job keeps off: a node where its workers failed, or where a pod of it was cut off, is avoided by
the job's next pods for failurePolicy.avoidNodeSeconds. Pure.

GPU fleets lose most of their time to nodes that stay bad (a GPU that fails every start, a NIC that drops a
pod's traffic), not to pods that die once: the pod that failed there is replaced by one that cannot land there
again (a required node affinity, builders.avoid_nodes), and the failures that follow on that node before its pod
is gone (torchrun restarts its workers in place, several times a second) are one incident with the first: they
cost no restart. The evidence is the operator's own: a pod whose phase the kubelet reported Failed, an agent's
log line read from an admitted pod (failures.py), a pod the kubelet reports not Ready while the agent is silent
(recovery.py). Nothing a pod writes into the store makes a node avoided.

The avoidance is the job's, counted from the first failure and ended by lowering avoidNodeSeconds. With
--taint-bad-nodes (off by default: it needs rights over nodes) a node avoided for a reason of its own is also
tainted for every pod until the last job's avoidance of it ends (taint below; the node's side is
elasticjob/taints.py). Where every node is avoided the job's new
pods stay Pending and the job says why (phase.py); it is not failed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.domain import Placement, Settings
from elasticjob.models import AvoidedNode, ElasticJobStatus
from elasticjob.naming import UNHEALTHY_TAINT as TAINT_KEY
from elasticjob.observe import PodView
from elasticjob.planner.base import DeletePod, Event, Job, Plan, RoundFailure, TaintNode, UntaintNode, since, stamp

# Kept in status at most; the oldest goes first (each expires anyway).
MAX_AVOIDED = 16
# The kubelet's grace for a pod stopped because its node or its network is bad: its workers fail or are cut
# off, so a planned stop (stopGraceSeconds, minutes with torchrun's own 30 s) could save nothing, and the job
# waits for the pod to go before its replacement is made. One second: the kubelet's own confirmation that the
# containers stopped still comes before the name is free (no force deletion: a frozen process must be gone).
BAD_POD_GRACE = 1
# A pod cut off (its agent lost the store while its kubelet says Ready): deleted at once, not waited for. No packet
# gets in or out of it and its node is avoided, so its processes can reach nothing and its replacement lands on
# another node; waiting for the kubelet's confirmation cost 3 s of the name on real nodes (the container killed
# in a cut network namespace), a quarter of the time back to full size. The kubelet still kills what is left.
CUT_OFF_GRACE = 0
WORKER_FAILED = "WorkerFailed"
# SIGTERM is what an agent sends its own other workers once one failed: a consequence, never the cause.
AGENT_SIGTERM = -15
# SIGKILL, in place: the kernel's OOM killer among others (the job's memory, which any node runs out of alike).
KILLED = -9
PARTITIONED = "Partitioned"
# The reasons that are the node's own (its GPU, its network, its speed), for which --taint-bad-nodes taints it for
# every pod; a reason added later taints only once it is added here. "SlowNode" is stragglers.SLOW_NODE and
# "SlowLink" links.SLOW_LINK (those modules import this one).
SICK = frozenset({WORKER_FAILED, "NodeCheckFailed", PARTITIONED, "SlowNode", "SlowLink"})


def avoid_seconds(job: Job) -> int:
    return job.ref.spec.failure_policy.avoid_node_seconds


def expire(plan: Plan, job: Job, now: datetime) -> None:
    """Drops the nodes whose time is up (counted from `since` with the spec's seconds as they are now, so that
    lowering them ends an avoidance at once), says so, and wakes the operator when the next one ends."""
    limit = timedelta(seconds=avoid_seconds(job))
    kept = []
    for entry in plan.status.avoided_nodes:
        age = since(entry.since, now)
        if age is not None and age >= limit:
            plan.normal("NodeNoLongerAvoided", f"node {entry.node} is no longer avoided: "
                        f"{int(age.total_seconds())}s since its first failure (failurePolicy.avoidNodeSeconds "
                        f"{avoid_seconds(job)})")
            continue
        if age is not None:
            entry.until = stamp(now - age + limit)
            plan.soon((limit - age).total_seconds())
        kept.append(entry)
    plan.status.avoided_nodes = kept


def taint(plan: Plan, job: Job, settings: Settings, now: datetime) -> None:
    """With --taint-bad-nodes, each node the job avoids for a reason of its own (SICK) is tainted until its
    avoidance ends, asked for at every plan (the planner cannot see the node; the controller sends what changed),
    and each such avoidance that ended since the stored status is untainted (the taint goes only where no later end
    is written on the node). Never without the setting."""
    if not settings.taint_bad_nodes:
        return
    for entry in plan.status.avoided_nodes:
        past_end = since(entry.until, now)  # negative while the avoidance runs
        if entry.reason in SICK and past_end is not None and past_end < timedelta(0):
            plan.act(TaintNode(entry.node, entry.reason, entry.until, event=Event(
                "Normal", "NodeTainted", f"node {entry.node} tainted {TAINT_KEY}={entry.reason}:NoSchedule until "
                f"{entry.until} (--taint-bad-nodes): no new pod of any job that does not tolerate it lands there; "
                f"running pods stay")))
    kept = set(avoided(plan.status))
    for entry in job.status.avoided_nodes:
        if entry.reason in SICK and entry.node not in kept:
            plan.act(UntaintNode(entry.node, event=Event(
                "Normal", "NodeUntainted", f"node {entry.node} untainted ({TAINT_KEY}): the job no longer avoids "
                f"it and no later end of another job's avoidance is written on it")))


def avoided(status: ElasticJobStatus) -> tuple[str, ...]:
    return tuple(entry.node for entry in status.avoided_nodes)


def placement(status: ElasticJobStatus) -> Placement:
    """What the job's new workers get so that they land on none of the avoided nodes."""
    return Placement(avoid_nodes=avoided(status))


def entry(status: ElasticJobStatus, node: str | None) -> AvoidedNode | None:
    return next((e for e in status.avoided_nodes if e.node == node), None) if node else None


def already_avoided(status: ElasticJobStatus, node: str | None, when: datetime) -> bool:
    """Whether a failure at `when` on `node` belongs to an incident already booked there: the node was avoided
    before it. Counts it on the node's entry."""
    found = entry(status, node)
    if found is None:
        return False
    began = since(found.since, when)
    if began is None or began < timedelta(0):
        return False
    found.failures += 1
    return True


def avoid(plan: Plan, job: Job, node: str | None, reason: str, message: str, when: datetime) -> None:
    """The job's next pods keep off `node` (an Event the first time); nothing while avoidNodeSeconds is 0."""
    if not node or avoid_seconds(job) <= 0 or entry(plan.status, node) is not None:
        return
    until = when + timedelta(seconds=avoid_seconds(job))
    plan.status.avoided_nodes = [*plan.status.avoided_nodes, AvoidedNode(
        node=node, reason=reason, message=message[-512:], since=stamp(when), until=stamp(until))][-MAX_AVOIDED:]
    plan.warn("NodeAvoided", f"the job's next pods avoid node {node} until {stamp(until)}: {message} "
              f"(failurePolicy.avoidNodeSeconds {avoid_seconds(job)})")


def blamed(failures: list[RoundFailure], cause: RoundFailure | None, workers: list[PodView]) -> PodView | None:
    """The worker whose node an in-place restart is laid on: the cause's, where its pod is the only one that logged a
    failure of its own. A peer whose collective broke when the bad node's worker died fails too (exit 1, logged
    first as often as not: seen on real nodes, the healthy node avoided); from the next round on, the bad node's
    worker fails at its start, before any collective, alone. None where it is not that clear."""
    if cause is None or cause.exit_code == KILLED:
        return None
    if {f.pod for f in failures if f.exit_code != AGENT_SIGTERM} != {cause.pod}:
        return None
    return next((p for p in workers if p.name == cause.pod), None)


def move_off(plan: Plan, pod: PodView, why: str) -> None:
    """Replaces a running worker on an avoided node: its replacement lands elsewhere."""
    if pod.deleting or pod.finished_at is not None:
        return
    plan.act(DeletePod(pod.name, pod.uid, grace_seconds=BAD_POD_GRACE, event=Event(
        "Warning", "MovedOffNode", f"stopping pod {pod.name} on node {pod.node}, which the job avoids: {why}; its "
        f"replacement goes to another node")))


def why_pending(status: ElasticJobStatus, pending: list[PodView]) -> str:
    """What a Pending worker's message adds when the job avoids nodes: no other node may fit."""
    if not pending or not status.avoided_nodes:
        return ""
    names = ", ".join(f"{e.node} ({e.reason}, until {e.until})" for e in status.avoided_nodes)
    return f"; the job avoids node(s) {names}: where no other node fits, its pods wait for one"
