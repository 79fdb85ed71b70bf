"""A slow link: the agent whose every link the round's probe found slow is replaced, and its node avoided. Pure.

Once a round of 3 or more agents forms, the kit's agents measure the link between every pair of them
(elasticjob_warm/linkprobe.py); the round's rank 0 names the agent whose best link is spec.nodeCheck.linkFactor
times slower than the median agent's (a sick NIC slows all its links, a healthy node keeps fast ones), and the
store maps that rank to the agent's address (observe.LinksView). A pair alone cannot say which end is slow: two
agents name nobody.

That verdict is the tenant's word, so what it can do is bounded as for stragglers: the address must be one of the
job's own running workers in the current, complete round; the pod is deleted (its agent asks for the planned stop
an eviction gets, so every rank saves the same step, and nothing is charged); one verdict replaces at most one pod
(the replacement joins a new round, which is probed anew). Nothing is done while the job is not calm.
"""

from __future__ import annotations

from datetime import datetime

from elasticjob.observe import LinksView, PodView
from elasticjob.planner import nodes, spares, stragglers
from elasticjob.planner.base import DeletePod, Event, Job, Observed, Plan

SLOW_LINK = "SlowLink"


def replace_slow_link(plan: Plan, job: Job, observed: Observed, now: datetime) -> None:
    """Deletes the worker the current round's link probe named, once, and avoids its node."""
    store = observed.store
    if not job.ref.spec.node_check.link_probe or store is None or store.links is None:
        return
    links = store.links
    if links.outlier is None or links.round != store.round or not stragglers.calm(plan, observed):
        return
    pod = named(links, observed.by_state.running, spares.pods_wanted(plan))
    if pod is None:
        return
    why = f"the link probe of round {links.round} found every link of pod {pod.name} slow: {links.reason}"
    nodes.avoid(plan, job, pod.node, SLOW_LINK, why, now)
    plan.act(DeletePod(pod.name, pod.uid, event=Event(
        "Warning", "SlowLinkReplaced", f"{why}: deleting it (a training that asks should_stop() saves a step "
        f"first); its replacement avoids node {pod.node}")))


def named(links: LinksView, running: tuple[PodView, ...], desired: int) -> PodView | None:
    """The running worker at the outlier's address (`running`: not already on its way out); None for any other."""
    return next((p for p in running if p.ip == links.outlier and p.index is not None and p.index < desired), None)
