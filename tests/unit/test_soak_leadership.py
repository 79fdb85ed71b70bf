"""The soak's only-one-replica-acts check (tests/soak/leadership.py), fed with made-up operator logs; and which
replica its operator kills hit (tests/soak/operators.py)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soak"))

from leadership import Term, acted_outside, breaks, overlaps, terms  # noqa: E402
from operators import LEADER_SHARE, Replica, choose  # noqa: E402

NS = "soak-abc"


def at(seconds: float) -> datetime:
    return datetime(2026, 11, 23, 3, 0, 0) + timedelta(seconds=seconds)


def line(seconds: float, message: str) -> str:
    return f"[{at(seconds):%Y-%m-%d %H:%M:%S},{at(seconds).microsecond // 1000:03d}] elasticjob [INFO    ] {message}"


def log(*lines: tuple[float, str]) -> str:
    return "\n".join(line(s, m) for s, m in lines)


LEADS = "leader election: elasticjob-host-1 is the leader; reconciling"
LOST = "leader election: lost the Lease: no renewal for 8 s"
RELEASED = f"leader election: released Lease {NS}/elasticjob-operator"
ACTS = f"[{NS}/alpha] phase Pending -> Running"


def test_a_term_runs_from_leading_to_losing_the_lease():
    text = log((1, "leader election: candidate x for Lease"), (2, LEADS), (5, ACTS), (9, LOST), (9.1, "exiting"))
    assert terms("a-0", text, ended=at(10)) == [Term("a-0", at(2), at(9))]


def test_a_killed_leader_leads_until_its_process_ended():
    assert terms("a-0", log((2, LEADS), (5, ACTS)), ended=at(7.5)) == [Term("a-0", at(2), at(7.5))]


def test_a_replica_that_only_waited_never_led():
    assert terms("b-0", log((1, "leader election: the Lease is held by x; this replica waits")), ended=at(9)) == []


@pytest.mark.parametrize("first, second, overlap", [
    ((0, 10), (20, 30), None),  # a SIGKILL, then the lease's duration: a gap
    ((0, 10), (10, 30), None),  # released, and taken at once: touching is not overlapping
    ((0, 10), (9.5, 30), 0.5),  # the next took the Lease before the first stopped
    ((0, 30), (10, 20), 10.0),  # one term inside another
])
def test_terms_of_two_replicas_overlap_only_when_both_led_at_once(first, second, overlap):
    a, b = Term("a-0", at(first[0]), at(first[1])), Term("b-0", at(second[0]), at(second[1]))
    found = overlaps([b, a])
    assert [seconds for _, _, seconds in found] == ([] if overlap is None else [pytest.approx(overlap)])


def test_an_overlap_is_found_past_a_term_in_between():
    long = Term("a-0", at(0), at(100))
    found = overlaps([long, Term("b-0", at(10), at(20)), Term("b-1", at(50), at(60))])
    assert [(x.who, y.who) for x, y, _ in found] == [("a-0", "b-0"), ("a-0", "b-1")]


def test_a_waiting_replica_that_writes_about_a_job_acted():
    text = log((1, "leader election: the Lease is held by x; this replica waits"), (3, ACTS),
               (4, f"[{NS}/beta] not the leader: not reconciling"))
    assert [line[-len(ACTS):] for line in acted_outside(text, NS, [])] == [ACTS]


def test_lines_about_jobs_within_the_term_and_about_other_namespaces_are_not_acting():
    text = log((2, LEADS), (3, ACTS), (9, RELEASED), (10, "[other-ns/alpha] phase Running"))
    assert acted_outside(text, NS, terms("a-0", text, at(11))) == []


def test_a_failover_after_a_kill_breaks_nothing_and_a_double_leader_breaks_the_rule():
    first = ("a-0", log((2, LEADS), (3, ACTS)), at(4))
    second = ("b-0", log((1, "candidate"), (15, LEADS), (16, ACTS)), at(30))
    assert breaks([first, second], NS) == []
    early = ("b-0", log((1, "candidate"), (3.5, LEADS), (16, ACTS)), at(30))
    assert [key for key, _ in breaks([first, early], NS)] == ["a-0+b-0"]
    eager = ("b-0", log((1, "candidate"), (3.5, ACTS), (15, LEADS)), at(30))
    assert [key for key, _ in breaks([first, eager], NS)] == ["b-0/outside"]


A, B = Replica("a"), Replica("b")


@pytest.mark.parametrize("leader, roll, pick, victim", [
    (A, 0.0, 0, A), (A, LEADER_SHARE - 0.01, 1, A),  # mostly the leader
    (A, LEADER_SHARE, 0, B), (B, 0.99, 1, A),  # else the other
    (None, 0.0, 0, A), (None, 0.0, 1, B),  # the holder is dead (not yet replaced): either
])
def test_a_kill_hits_the_leader_mostly_and_either_replica_while_none_leads(leader, roll, pick, victim):
    assert choose([A, B], leader, roll, pick) is victim


def test_the_one_replica_without_leader_election_is_always_the_one_killed():
    assert choose([A], A, 0.99, 0) is A
