"""The split-brain check of bench/split_brain.py finds two worlds stepping at once, and only then."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from split_brain import overlaps, worlds  # noqa: E402


def step(t: float, master: str, resumed: int = 0, size: int = 2) -> dict:
    return {"time": t, "master": master, "resumed_from": resumed, "world_size": size}


def test_worlds_one_after_the_other_are_no_split_brain():
    found = [step(1, "a:1"), step(2, "a:1"), step(5, "b:2", 2), step(6, "b:2", 2)]
    assert overlaps(worlds(found)) == []


def test_two_worlds_stepping_at_the_same_time_are_found():
    found = [step(1, "a:1"), step(4, "a:1"), step(2, "b:2", 0, 1), step(3, "b:2", 0, 1)]
    assert overlaps(worlds(found)) == [("a:1/0", "b:2/0")]


def test_a_reused_port_in_a_later_world_is_another_world():
    found = [step(1, "a:1", 0), step(2, "a:1", 0), step(3, "b:2", 2), step(4, "b:2", 2), step(5, "a:1", 4)]
    assert overlaps(worlds(found)) == []
