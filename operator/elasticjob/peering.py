"""Which of several operator replicas acts (kopf peering), as a pure rule.

kopf pauses its watches in every replica but the highest-priority live one. The reconcile loops are
ours, not kopf's, so they check the same rule before they act: a paused replica must not reconcile on
its own timers with what it saw before the pause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

DEFAULT_LIFETIME_SECONDS = 60


@dataclass(frozen=True)
class Peering:
    name: str
    identity: str
    priority: int
    namespace: str | None  # None: a ClusterKopfPeering; else the KopfPeering in the first watched namespace


def _alive(info: Mapping[str, Any], now: datetime) -> bool:
    try:
        seen = datetime.fromisoformat(str(info["lastseen"]))
    except (KeyError, ValueError):
        return False
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=now.tzinfo)
    return seen + timedelta(seconds=float(info.get("lifetime", DEFAULT_LIFETIME_SECONDS))) >= now


def is_active(peers: Mapping[str, Mapping[str, Any]], identity: str, priority: int, now: datetime) -> bool:
    """kopf's rule: act only when registered and no other live peer has an equal or higher priority."""
    if identity not in peers:
        return False
    return not any(other != identity and _alive(info, now) and int(info.get("priority", 0)) >= priority
                   for other, info in peers.items())
