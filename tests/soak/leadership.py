"""Whether two operator replicas ever acted at once, read from their logs: pure, fed with log text.

Each incarnation of a replica writes its own log. Its term as leader runs from its "is the leader; reconciling"
line to its "lost the Lease" or "released Lease" line, or, with neither, to the moment its process ended (a
SIGKILL leaves no line). Two things must hold:
- no two terms overlap. The Lease guarantees a gap, not a tolerance: a leader stops acting once it has not renewed
  for the renew deadline (8 s), and another replica takes the Lease only once it has seen the same record for the
  lease's duration (10 s). Every log is written on this one host's clock, so any overlap at all means a replica
  acted after another had taken over;
- a replica writes a line about a job (kopf's "[namespace/name]" prefix: only a reconcile that passed the
  leader's gate writes one) only within its own term.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

LEADING = "is the leader; reconciling"
TERM_ENDS = ("leader election: lost the Lease", "leader election: released Lease")
HOLDING_BACK = "not the leader: not reconciling"  # the one line about a job a waiting replica may write (debug)


@dataclass(frozen=True)
class Term:
    who: str  # the incarnation's log name
    start: datetime
    end: datetime


def logged_at(line: str) -> datetime | None:
    """The time of an operator log line ('[2026-11-23 03:22:02,815] ...'), in local time."""
    try:
        return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None


def terms(who: str, text: str, ended: datetime) -> list[Term]:
    """The incarnation's terms as leader (one at most, as a replica exits once it loses the Lease)."""
    found, start = [], None
    for line in text.splitlines():
        at = logged_at(line)
        if at is None:
            continue
        if start is None and LEADING in line:
            start = at
        elif start is not None and any(end in line for end in TERM_ENDS):
            found.append(Term(who, start, at))
            start = None
    if start is not None:
        found.append(Term(who, start, ended))
    return found


def overlaps(all_terms: list[Term]) -> list[tuple[Term, Term, float]]:
    """Every pair of terms that overlap, with the seconds they overlap (one incarnation's terms never do)."""
    ordered = sorted(all_terms, key=lambda t: t.start)
    found = []
    for i, first in enumerate(ordered):
        for second in ordered[i + 1:]:
            if second.start >= first.end:
                break  # sorted by start: no later term starts before this one ends
            found.append((first, second, (min(first.end, second.end) - second.start).total_seconds()))
    return found


def acted_outside(text: str, namespace: str, own: list[Term]) -> list[str]:
    """The lines about a job of `namespace` written outside the incarnation's own terms."""
    prefix = f"[{namespace}/"
    outside = []
    for line in text.splitlines():
        at = logged_at(line)
        if at is None or prefix not in line or HOLDING_BACK in line:
            continue
        if not any(t.start <= at <= t.end for t in own):
            outside.append(line)
    return outside


def breaks(incarnations: list[tuple[str, str, datetime]], namespace: str) -> list[tuple[str, str]]:
    """(key, detail) for each break of the rule, from every incarnation's (log name, log text, end)."""
    own = {who: terms(who, text, ended) for who, text, ended in incarnations}
    found = [(f"{a.who}+{b.who}", f"{a.who} led {a.start:%H:%M:%S.%f} to {a.end:%H:%M:%S.%f} and {b.who} from "
                                  f"{b.start:%H:%M:%S.%f}: {seconds:.3f} s at once")
             for a, b, seconds in overlaps([t for found in own.values() for t in found])]
    for who, text, _ in incarnations:
        lines = acted_outside(text, namespace, own[who])
        if lines:
            found.append((f"{who}/outside", f"{who} wrote {len(lines)} lines about jobs while not the leader, "
                                            f"the first: {lines[0][:160]}"))
    return found
