"""Goodput that counts capacity (status.goodput: capacityLostSeconds, weightedGoodputPercent): a step trained by
2 of the job's 3 wanted nodes is two thirds of a step. Pure.

Outside incidents, whose seconds count whole in lostSeconds, the ledger follows the training's size: the nodes of
the store's latest complete round against status.desiredReplicas. A stretch with fewer nodes (shortOfSize) opens
when it is first seen (a round with fewer nodes, or the close of an incident that left the training smaller) and is
added up, each second weighted by the share of nodes missing, when it ends: the size or the wish changes, an
incident opens (counted up to the incident's start, so no second counts twice), or the job finishes. The status is
written at those moments only, never every second; a stretch still going is not in the figures yet.

What is wanted is desiredReplicas, not spec.replicas: workers Kueue did not admit are the platform's decision. What
a job kept below its size loses shows here: a cut-off pod kept, a replacement slow to start, a scale-up waiting for
a node. A store that does not say (lost, or its round re-forming) leaves the stretch as it was.
"""

from __future__ import annotations

from datetime import datetime

from elasticjob.models import GoodputStatus, ShortOfSize
from elasticjob.observe import StoreView
from elasticjob.planner import goodput
from elasticjob.planner.base import Observed, Plan, precise
from elasticjob.planner.rejoin import parse


def track(plan: Plan, observed: Observed, now: datetime) -> None:
    """After the ledger's incidents were advanced (ledger.track): the stretch short of size followed, and the
    weighted figure kept in step with the ledger's wall and lost seconds."""
    status = plan.status
    ledger = status.goodput
    if ledger is None:
        return
    incident = ledger.open_incident
    short = ledger.short_of_size
    if incident is not None:
        lost = fold(ledger, min(now, parse(incident.start_time) or now))
    elif status.phase.finished:
        lost = fold(ledger, now)
    else:
        lost = follow(ledger, nodes_now(observed.store), status.desired_replicas, now)
    if short is not None and lost is not None:
        plan.normal("ShortOfSizeEnded", f"the training ran at {short.nodes} of {short.desired} nodes since "
                                        f"{short.since}: {lost:.1f} s of capacity lost")
    ledger.weighted_goodput_percent = weighted(ledger)


def nodes_now(store: StoreView | None) -> int | None:
    """The nodes the training runs with, as its store says: those of its complete round; None where it does not
    say (no store answering, a round forming or closed)."""
    if store is None or not store.complete or store.closed or store.round is None:
        return None
    return store.nodes


def follow(ledger: GoodputStatus, nodes: int | None, desired: int, now: datetime) -> float | None:
    """The stretch short of size begun, ended or left as it is by the nodes training now; what an ended one cost
    (None: none ended)."""
    if nodes is None:
        return None
    short = ledger.short_of_size
    if short is not None and (short.nodes, short.desired) == (nodes, desired):
        return None
    lost = fold(ledger, now)
    if 0 < nodes < desired:
        ledger.short_of_size = ShortOfSize(since=precise(now), nodes=nodes, desired=desired)
    return lost


def fold(ledger: GoodputStatus, end: datetime) -> float | None:
    """The stretch going on, if any, added up to `end` and ended, the ledger's wall time taken to `end` with it;
    its weighted seconds (None: no stretch)."""
    short = ledger.short_of_size
    if short is None:
        return None
    ledger.short_of_size = None
    began = parse(short.since) or end
    seconds = max(0.0, (end - began).total_seconds())
    missing = max(0, short.desired - short.nodes) / short.desired if short.desired > 0 else 0.0
    lost = round(seconds * missing, 3)
    ledger.capacity_lost_seconds = round(ledger.capacity_lost_seconds + lost, 3)
    since = parse(ledger.since)
    if since is not None:
        ledger.wall_seconds = round(max(ledger.wall_seconds, (end - since).total_seconds()), 3)
        ledger.goodput_percent = goodput.ettr(ledger.wall_seconds, ledger.lost_seconds)
    return lost


def weighted(ledger: GoodputStatus) -> float | None:
    """ETTR with the seconds short of size taken out as well; None while goodputPercent is."""
    if ledger.goodput_percent is None:
        return None
    return goodput.ettr(ledger.wall_seconds, ledger.lost_seconds + ledger.capacity_lost_seconds)
