"""Stragglers: a worker pod whose model forward takes spec.stragglers.factor times the median of the other
pods' for windowSeconds is replaced, and its node avoided. Pure.

In a data-parallel step every rank waits for the slowest in the gradients' all-reduce: one slow node (a
throttled CPU, a GPU that clocks down) sets the whole job's pace for as long as it runs. The step time cannot
tell which rank is slow (it is the same everywhere); each rank's forward, which runs no collective, can
(elasticjob_progress.Progress.watch, read by the store: observe.PaceView).

Those times are the tenant's word, so what they can do is bounded: the pod they name must be one of the job's
own running workers; it is replaced by deleting it (its agent asks for the planned stop an eviction gets, so
every rank saves the same step, and nothing is charged), and a window passes between one suspicion and its
replacement. Nothing is done while the job recovers from an incident, a planned stop is under way, the training
stalls, or the round is not complete; a suspicion is held meanwhile, not forgotten.
"""

from __future__ import annotations

from datetime import datetime

from elasticjob.models import Straggler
from elasticjob.observe import PaceView, PodView
from elasticjob.planner import nodes, spares
from elasticjob.planner.base import DeletePod, Event, Job, Observed, Plan, since, stamp

SLOW_NODE = "SlowNode"
# The store's elasticjob_store.pace.LOOK_FACTOR (a unit test keeps the two equal): it wakes the operator when
# which pod is this many times slower changes. Meanwhile a pod that slow is looked at every LOOK_AGAIN seconds
# (two of the store's reads of the paces).
LOOK_FACTOR = 1.5
LOOK_AGAIN = 4.0
# A forward slower than the others' by less than this is no straggler, whatever the ratio: on a small model (a
# forward of 2 ms) the scheduler's noise makes one pod 3 to 9 times the others for seconds at a time (seen on real
# nodes while operator pods rolled out: two pods replaced in one job), and a pod can cost each step at most this.
MIN_EXCESS_SECONDS = 0.01


Found = tuple[PodView, PaceView, float]


def slowest(paces: tuple[PaceView, ...], workers: tuple[PodView, ...], desired: int) -> Found | None:
    """The slowest of the job's running workers (`workers`) that report a pace, its pace, and how many times the
    median of the others' it is; None for fewer than two such workers."""
    running = {p.name: p for p in workers if p.index is not None and p.index < desired}
    found = sorted(((running[pace.pod], pace) for pace in paces if pace.pod in running),
                   key=lambda pair: (pair[1].seconds, pair[0].name))
    if len(found) < 2:
        return None
    pod, pace = found[-1]
    others = sorted(p.seconds for _, p in found[:-1])
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    return pod, pace, pace.seconds / median


def slow(found: Found | None, factor: float) -> bool:
    """The slowest is `factor` times the others' median, and MIN_EXCESS_SECONDS slower than it."""
    if found is None:
        return False
    _, pace, ratio = found
    return ratio >= factor and pace.seconds - pace.seconds / ratio >= MIN_EXCESS_SECONDS


def calm(plan: Plan, observed: Observed) -> bool:
    """The job trains in a complete round, with no incident open and no planned stop under way."""
    store, ledger = observed.store, plan.status.goodput
    return store is not None and store.round is not None and store.complete and not store.closed \
        and plan.status.planned_stop is None and (ledger is None or ledger.open_incident is None) \
        and not (store.progress is not None and store.progress.stalled)


def replace_stragglers(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    """Notes a worker slower than the others (status.straggler, an Event), replaces it once it stayed so for the
    window, and forgets it once it is not (or is gone)."""
    spec, status = job.ref.spec.stragglers, plan.status
    if not spec.enabled:
        status.straggler = None
        return
    if replaced_and_still_seen(plan, observed):
        return
    found = slowest(observed.store.pace, observed.by_state.running, spares.pods_wanted(plan)) \
        if observed.store else None
    if found is not None and found[2] >= LOOK_FACTOR:
        # The store wakes the operator when which pod is LOOK_FACTOR slower changes, not when its factor passes the
        # spec's, nor when the job turns calm again: looked at every two reads of the paces meanwhile (seen on real
        # nodes: a pod slow from its start, or held while the job was not calm, was looked at again 25 s late).
        plan.soon(LOOK_AGAIN)
    if not calm(plan, observed):
        # Held, not forgotten: a slow rank stalls the training now and then itself (seen on real nodes: a CPU at a
        # tenth of a core made the step stall past the store's limit, which restarted the window twice).
        return
    if found is None or not slow(found, spec.factor):
        recovered(plan, observed, found)
        return
    pod, pace, factor = found
    known = status.straggler
    if known is None or known.pod != pod.name or known.uid not in (None, pod.uid):
        status.straggler = Straggler(pod=pod.name, node=pod.node, factor=round(factor, 2), seconds=pace.seconds,
                                     since=stamp(now), uid=pod.uid)
        plan.warn("SlowWorker", f"pod {pod.name} (node {pod.node}) takes {pace.seconds:.3g}s per forward, "
                  f"{factor:.1f} times the median of the other workers': it is replaced if it stays so for "
                  f"{spec.window_seconds}s (spec.stragglers)")
        plan.soon(spec.window_seconds)
        return
    known.factor, known.seconds = round(factor, 2), pace.seconds
    age = since(known.since, now)
    if age is None or age.total_seconds() < spec.window_seconds:
        plan.soon(spec.window_seconds - (age.total_seconds() if age is not None else 0.0))
        return
    replace(plan, job, pod, known, now)


def replaced_and_still_seen(plan: Plan, observed: Observed) -> bool:
    """The straggler was deleted and its pod is still seen: nothing is noted (seen on real nodes: the next plan,
    before the cache showed the deletion, noted the same pod slow again). Forgotten once the pod is gone."""
    known = plan.status.straggler
    if known is None or not known.replaced:
        return False
    if any(p.uid == known.uid for p in observed.workers):
        return True
    plan.status.straggler = None
    return False


def replace(plan: Plan, job: Job, pod: PodView, known: Straggler, now: datetime) -> None:
    why = (f"pod {pod.name} stayed {known.factor:.1f} times slower than the other workers for "
           f"{job.ref.spec.stragglers.window_seconds}s or more ({known.seconds:.3g}s per forward)")
    nodes.avoid(plan, job, pod.node, SLOW_NODE, why, now)
    plan.act(DeletePod(pod.name, pod.uid, event=Event(
        "Warning", "StragglerReplaced", f"{why}: deleting it (a training that asks should_stop() saves a step "
        f"first); its replacement avoids node {pod.node}")))
    known.replaced, known.uid = True, pod.uid


def recovered(plan: Plan, observed: Observed, found: Found | None) -> None:
    """Forgets the straggler once it is not one; says so where its pod is still there and has caught up."""
    known = plan.status.straggler
    if known is None:
        return
    plan.status.straggler = None
    still = any(p.name == known.pod and not p.deleting for p in observed.workers)
    if still and found is not None:
        plan.normal("SlowWorkerRecovered", f"pod {known.pod} is no longer slower than the others")
