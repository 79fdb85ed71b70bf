"""Which replica acts under kopf peering: the same rule kopf pauses its watches by."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from elasticjob.peering import is_active

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
FRESH = "2026-01-01T11:59:50+00:00"
STALE = "2026-01-01T11:58:00+00:00"


def peer(priority, lastseen=FRESH, lifetime=60):
    return {"priority": priority, "lastseen": lastseen, "lifetime": lifetime}


@pytest.mark.parametrize("peers, active", [
    ({"me": peer(5)}, True),
    ({"me": peer(5), "other": peer(3)}, True),
    ({"me": peer(5), "other": peer(9)}, False),
    ({"me": peer(5), "other": peer(5)}, False),  # kopf pauses both on a tie
    ({"me": peer(5), "other": peer(9, lastseen=STALE)}, True),  # a dead peer does not count
    ({"other": peer(1)}, False),  # not registered yet: kopf has not resumed us either
    ({}, False),
])
def test_is_active(peers, active):
    assert is_active(peers, "me", 5, NOW) is active
