"""Which operator replica acts: leader election on a coordination.k8s.io/v1 Lease, as pure decisions.

The rules are client-go's (k8s.io/client-go/tools/leaderelection), which every kube controller follows:
- a candidate never trusts another node's clock: it takes a Lease held by another only once the Lease's record
  has not changed for leaseDurationSeconds of *its own* clock since it first saw that record;
- the leader renews every `renew_every` and stops acting once no renewal has succeeded for `renew_deadline`,
  counted from when the last successful renewal was *sent* (earlier than the API server stored it): it stops
  before any candidate's `duration` can have run out, because that candidate saw the renewal no sooner;
- every write carries the resourceVersion it was decided from, so of two candidates racing for one Lease the
  API server accepts one and answers 409 to the other;
- a leader that stops cleanly empties holderIdentity: a candidate takes an empty Lease at once;
- unlike client-go, the holder's leaseDurationSeconds is trusted only up to `TRUST_FACTOR` times our own, and
  renewTime is never read as a time (only compared, as part of the record): anyone who can write the Lease
  could otherwise set a duration of years and keep every replica from taking over after that holder is gone.
The I/O loop around these is controller/leader.py.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

API_VERSION = "coordination.k8s.io/v1"
PLURAL = "leases"
# How much longer than our own duration another holder's written duration is waited for. Above 1 so that a
# replica configured longer than us (a rollout that changes the timing) is still waited for; bounded so that
# a stray or hostile writer delays a takeover by at most this factor (60 s with the default 10 s). A replica
# configured more than this much longer than us could be taken over while it still acts: keep timings close.
TRUST_FACTOR = 6.0


@dataclass(frozen=True)
class Timing:
    """Seconds. A SIGKILLed leader's Lease is taken at most duration + retry_every after its last renewal."""

    duration: float = 10.0  # leaseDurationSeconds written on the Lease
    renew_every: float = 2.0  # the leader's renewals
    retry_every: float = 1.0  # a candidate's reads (and a leader's retries after a failed renewal)
    renew_deadline: float = 8.0  # the leader gives up acting after this long without a successful renewal


@dataclass(frozen=True)
class Where:
    name: str
    namespace: str
    identity: str  # holderIdentity: names this process (the pod's name, then a random part)


@dataclass(frozen=True)
class Seen:
    """The Lease's record as last seen, and when it was first seen so (time.monotonic() of this process)."""

    record: tuple[Any, ...]
    at: float


class Verdict(enum.Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # ours
    TAKE = "take"  # released, or its holder has not renewed for its duration
    WAIT = "wait"  # another holds it and is alive


def holder(lease: dict[str, Any] | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def _record(lease: dict[str, Any]) -> tuple[Any, ...]:
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"),
            spec.get("leaseDurationSeconds"), spec.get("leaseTransitions"))


def decide(lease: dict[str, Any] | None, identity: str, seen: Seen | None, now: float,
           timing: Timing) -> tuple[Verdict, Seen | None]:
    """What to do with the Lease as read now, and the observation to keep for the next read."""
    if lease is None:
        return Verdict.CREATE, None
    record = _record(lease)
    seen = seen if seen is not None and seen.record == record else Seen(record, now)
    owner = holder(lease)
    if owner == identity:
        return Verdict.RENEW, seen
    if not owner:
        return Verdict.TAKE, seen
    duration = _held_duration((lease.get("spec") or {}).get("leaseDurationSeconds"), timing)
    return (Verdict.TAKE if now - seen.at >= duration else Verdict.WAIT), seen


def _held_duration(written: Any, timing: Timing) -> float:
    """How long to wait out the holder's record: its own leaseDurationSeconds, capped at TRUST_FACTOR times ours.

    A value that is not a positive finite number (absent, zero, negative, a string, NaN) counts as ours: taking
    at once on a negative duration would let a writer hand leadership around, and a ValueError would stop the
    election loop (controller/leader.py)."""
    if isinstance(written, bool) or not isinstance(written, int | float) or not 0 < written < float("inf"):
        return timing.duration
    return min(float(written), TRUST_FACTOR * timing.duration)


def still_leading(renewed_at: float, now: float, timing: Timing) -> bool:
    """Whether the leader may go on acting, `renewed_at` being when its last successful renewal was sent."""
    return now - renewed_at < timing.renew_deadline


def micro_time(now: datetime) -> str:
    """A MicroTime as the API server writes it (RFC 3339, microseconds, UTC)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claim(lease: dict[str, Any] | None, verdict: Verdict, where: Where, now: datetime,
          timing: Timing) -> dict[str, Any]:
    """The Lease to write for CREATE, RENEW or TAKE: the one read, with its resourceVersion, changed."""
    stamp = micro_time(now)
    if verdict is Verdict.CREATE or lease is None:
        return {"apiVersion": API_VERSION, "kind": "Lease",
                "metadata": {"name": where.name, "namespace": where.namespace},
                "spec": {"holderIdentity": where.identity, "leaseDurationSeconds": int(timing.duration),
                         "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0}}
    body = copy.deepcopy(lease)
    spec = body.setdefault("spec", {})
    if verdict is Verdict.TAKE:
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec.update(holderIdentity=where.identity, leaseDurationSeconds=int(timing.duration), renewTime=stamp)
    return body


def released(lease: dict[str, Any] | None, identity: str, now: datetime) -> dict[str, Any] | None:
    """The Lease given up by its holder (as client-go's ReleaseOnCancel), or None when it is not ours."""
    if lease is None or holder(lease) != identity:
        return None
    body = copy.deepcopy(lease)
    stamp = micro_time(now)
    spec = body["spec"]
    spec.pop("holderIdentity", None)
    spec.update(leaseDurationSeconds=1, acquireTime=stamp, renewTime=stamp)
    return body
