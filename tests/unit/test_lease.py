"""Leader election's decisions (elasticjob.lease): who creates, renews, takes or waits for the Lease, given the
Lease as read and this process's clock; and the bodies written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from elasticjob.lease import (
    TRUST_FACTOR,
    Seen,
    Timing,
    Verdict,
    Where,
    claim,
    decide,
    micro_time,
    released,
    still_leading,
)

T = Timing(duration=10, renew_every=2, retry_every=1, renew_deadline=8)
ME, OTHER = "me", "other"
WHERE = Where("elasticjob-operator", "ops", ME)
NOW = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)


def lease(holder=OTHER, renew="2026-01-01T11:59:59.000000Z", duration=10, transitions=3, rv="41"):
    spec = {"leaseDurationSeconds": duration, "acquireTime": "2026-01-01T11:00:00.000000Z", "renewTime": renew,
            "leaseTransitions": transitions}
    if holder is not None:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "elasticjob-operator", "namespace": "ops", "resourceVersion": rv}, "spec": spec}


def seen_at(body, at):
    """What a candidate keeps after reading `body` at `at`."""
    return decide(body, "observer", None, at, T)[1]


@pytest.mark.parametrize("current, seen, now, verdict", [
    pytest.param(None, None, 100.0, Verdict.CREATE, id="no Lease: create it"),
    pytest.param(lease(ME), None, 100.0, Verdict.RENEW, id="ours: renew"),
    pytest.param(lease(None), None, 100.0, Verdict.TAKE, id="released (no holder): take at once"),
    pytest.param(lease(""), None, 100.0, Verdict.TAKE, id="released (empty holder): take at once"),
    pytest.param(lease(), None, 100.0, Verdict.WAIT, id="another's, first sight: wait a whole duration"),
    pytest.param(lease(), seen_at(lease(), 100.0), 109.9, Verdict.WAIT, id="unchanged for less than its duration"),
    pytest.param(lease(), seen_at(lease(), 100.0), 110.0, Verdict.TAKE, id="unchanged for its duration: expired"),
    pytest.param(lease(renew="2026-01-01T11:59:59.500000Z"), seen_at(lease(), 100.0), 150.0, Verdict.WAIT,
                 id="renewed since last seen: alive, whatever the clocks say"),
    pytest.param(lease(OTHER, duration=30), seen_at(lease(duration=30), 100.0), 120.0, Verdict.WAIT,
                 id="the holder's own longer duration is waited for"),
    pytest.param(lease(OTHER, duration=30), seen_at(lease(duration=30), 100.0), 130.0, Verdict.TAKE,
                 id="and then taken"),
])
def test_decide(current, seen, now, verdict):
    assert decide(current, ME, seen, now, T)[0] is verdict


def test_the_clock_restarts_when_the_record_changes():
    first = seen_at(lease(), 100.0)
    _, again = decide(lease(), ME, first, 105.0, T)
    assert again == first  # the same record: still timed from its first sight
    _, renewed = decide(lease(renew="2026-01-01T12:00:01.000000Z"), ME, first, 105.0, T)
    assert renewed == Seen(renewed.record, 105.0)


@pytest.mark.parametrize("since_renewal, leading", [(0.0, True), (7.9, True), (8.0, False), (30.0, False)])
def test_the_leader_stops_at_the_renew_deadline(since_renewal, leading):
    assert still_leading(100.0, 100.0 + since_renewal, T) is leading


def test_the_deadline_ends_before_a_candidate_may_take_over():
    assert T.renew_deadline < T.duration


@pytest.mark.parametrize("verdict, current, acquire, transitions", [
    (Verdict.CREATE, None, micro_time(NOW), 0),
    (Verdict.RENEW, lease(ME), "2026-01-01T11:00:00.000000Z", 3),
    (Verdict.TAKE, lease(OTHER), micro_time(NOW), 4),
])
def test_claim(verdict, current, acquire, transitions):
    body = claim(current, verdict, WHERE, NOW, T)
    assert body["spec"] == {"holderIdentity": ME, "leaseDurationSeconds": 10, "acquireTime": acquire,
                            "renewTime": "2026-01-01T12:00:00.250000Z", "leaseTransitions": transitions}
    assert body["metadata"].get("resourceVersion") == (current or {}).get("metadata", {}).get("resourceVersion")
    assert (body["metadata"]["name"], body["metadata"]["namespace"]) == ("elasticjob-operator", "ops")


def test_claim_writes_the_version_it_read_and_leaves_the_read_alone():
    read = lease(OTHER, rv="77")
    body = claim(read, Verdict.TAKE, WHERE, NOW, T)
    assert body["metadata"]["resourceVersion"] == "77"
    assert read["spec"]["holderIdentity"] == OTHER


def test_released_empties_the_holder_of_our_lease_only():
    body = released(lease(ME, rv="9"), ME, NOW)
    assert body is not None and "holderIdentity" not in body["spec"]
    assert body["spec"]["leaseDurationSeconds"] == 1 and body["metadata"]["resourceVersion"] == "9"
    assert decide(body, OTHER, None, 0.0, T)[0] is Verdict.TAKE
    assert released(lease(OTHER), ME, NOW) is None
    assert released(None, ME, NOW) is None


def test_a_huge_written_duration_is_waited_for_only_up_to_the_cap():
    """Another writer's leaseDurationSeconds of 10**9 must not keep us from ever taking over (issue 52)."""
    huge = lease(OTHER, duration=10**9)
    first = seen_at(huge, 100.0)
    cap = TRUST_FACTOR * T.duration
    assert decide(huge, ME, first, 100.0 + cap - 0.1, T)[0] is Verdict.WAIT
    assert decide(huge, ME, first, 100.0 + cap, T)[0] is Verdict.TAKE


@pytest.mark.parametrize("written", [0, -5, -10**9, "forever", "30", None, True, float("nan"), float("inf"),
                                     [30], {"s": 30}])
def test_a_written_duration_that_is_no_positive_number_counts_as_ours(written):
    bad = lease(OTHER, duration=written)
    first = seen_at(bad, 100.0)
    assert decide(bad, ME, first, 100.0 + T.duration - 0.1, T)[0] is Verdict.WAIT
    assert decide(bad, ME, first, 100.0 + T.duration, T)[0] is Verdict.TAKE


@pytest.mark.parametrize("renew", ["9999-12-31T23:59:59.999999Z", "-0001-01-01T00:00:00Z", "", "soon", -1,
                                   10**18, None])
def test_a_written_renew_time_is_only_compared_never_trusted(renew):
    odd = lease(OTHER, renew=renew)
    first = seen_at(odd, 100.0)
    assert decide(odd, ME, first, 100.0 + T.duration - 0.1, T)[0] is Verdict.WAIT
    assert decide(odd, ME, first, 100.0 + T.duration, T)[0] is Verdict.TAKE
