"""The store's rounds as the downtime ledger reads them (ledger.py): a round that completed past the last one
accounted for, whether it is a restart no booked fault explains (a Rejoin) and when its training stopped, and
whether a lost store's agents rode the loss out or resumed their round on the one that came back. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

from elasticjob.models import ElasticJobStatus, GoodputStatus, Incident
from elasticjob.observe import ProgressView, StoreView
from elasticjob.planner import goodput
from elasticjob.planner.base import precise
from elasticjob.planner.failures import is_round_record

# The longest a round may have taken to form for its start to bound a Rejoin's: past it, the mark is not this pause's.
MAX_FORMING = timedelta(minutes=2)


def parse(value: str | None) -> datetime | None:
    return None if not value else datetime.fromisoformat(value.replace("Z", "+00:00"))


def rode_out(status: ElasticJobStatus, incident: Incident) -> bool:
    """No worker pod ended since the store was lost: its agents rode the loss out (elasticjob_warm/outage.py) and
    the training stepped on until they restarted it on the store that came back. Those steps may never show:
    the training reports them to the store, which was gone, and agents that find it back at once restart the
    workers before any reaches the new one (the loss was booked from the store's kill, 3.2 s, for a 1.1 s
    restart)."""
    start = parse(incident.start_time)
    ended = [parse(f.time) for f in status.last_failures if f.time and not is_round_record(f)]
    return start is not None and not any(at is not None and at >= start for at in ended)


def resumed_round(status: ElasticJobStatus, ledger: GoodputStatus, store: StoreView | None,
                  progress: ProgressView | None) -> bool:
    """The agents wrote the round they ran back into a store that came back (elasticjob_warm/resume.py): the
    round last accounted, under the new store's epoch, and no training process begun since the loss (where one
    reports). Nothing restarted: no Rejoin."""
    if store is None or not store.complete or ledger.round is None or ledger.epoch is None:
        return False
    if store.epoch == ledger.epoch or store.round != ledger.round:
        return False
    lost = parse(status.rendezvous.last_lost_time)
    began = progress.started_at if progress is not None else None
    return lost is None or began is None or began <= lost


def regrouped(ledger: GoodputStatus, store: StoreView | None) -> bool:
    """A round completed past the last one accounted for: a later one of the same store, or one of a new store."""
    if store is None or not store.complete or store.round is None or ledger.round is None:
        return False
    return store.epoch != ledger.epoch or store.round > ledger.round


def rejoined(ledger: GoodputStatus, store: StoreView | None, progress: ProgressView | None,
             now: datetime) -> Incident | None:
    """A round completed past the last one accounted for, with no incident open: torch restarted every worker
    because an agent joined (a lost pod's replacement, an agent back from a partition, a late starter), or its
    agents re-formed on a store that came back, and no fault the operator booked explains it. It starts where
    stopped_before puts the training's stop."""
    if store is None or not regrouped(ledger, store):
        return None
    return Incident(kind="Rejoin", reason="AgentJoined" if store.epoch == ledger.epoch else "StoreReturned",
                    start_time=precise(stopped_before(progress, now, store.round_completed_at,
                                                      store.round_forming_since)))


def stopped_before(progress: ProgressView | None, now: datetime, round_at: datetime | None = None,
                   forming: datetime | None = None) -> datetime:
    """When the training stopped for a restart seen only now: its last reported step; or, where the report is
    already rank 0's new process's (begun within the last few seconds: the warm start loads and steps within a
    second of the round) and the old one's last step is gone with it, just before the new one began (what went
    before that is not known: the count is short by the rendezvous); else now. A report last changed before the
    round completed (`round_at`; both the store's clock) is the old process's, however recently that began: a
    newcomer rejoining just after another recovery restarts the process that recovery started. Without a report
    (a script that reports no steps, or a store that came back), when the store first saw the round before break
    up (`forming`: an agent left it to re-form, its workers stopped), else the round's completion: a Rejoin was
    booked at 0.0 s where the training paused 0.7-1.6 s."""
    def recent(at: datetime | None) -> bool:
        return at is not None and timedelta(0) <= now - at <= timedelta(seconds=goodput.MAX_CARRY_SECONDS)
    if progress is None:
        if round_at is None or not recent(round_at):
            return now
        if forming is not None and timedelta(0) <= round_at - forming <= MAX_FORMING:
            return forming
        return round_at
    began, last = progress.started_at, progress.step_at
    before_round = round_at is not None and progress.received_at is not None and progress.received_at <= round_at
    if recent(began) and began is not None and not before_round:
        return began - timedelta(milliseconds=1)
    if recent(last) and last is not None:
        return last
    return now
