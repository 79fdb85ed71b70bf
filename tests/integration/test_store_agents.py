"""The store's control endpoint with real torchrun agents on loopback (no Kubernetes): the operator's nudges.

Each test starts `python -m elasticjob_store` and two or three agents (127.0.0.11-13) with the operator's fast
rendezvous settings, and plays the operator's part through HTTP. About 30-40 s per test on 2 busy cores.
The `slow` ones also run the same scenario without nudges, as the baseline the nudges are measured against
(the frozen-peer baseline waits out a 60 s process-group timeout); `make test` skips them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from store_agents_support import Cluster, now

from helpers import wait_for

# Alone (make test runs these after the tier's parallel part): real torch agents on this machine's CPUs, which
# beside other tests take twice as long and gain nothing.
pytestmark = pytest.mark.alone

ADDRS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
FIRST_WORLD_TIMEOUT = 150  # three concurrent `import torch` on two shared cores, plus the last call


@pytest.fixture
def clusters(tmp_path) -> Iterator:
    made: list[Cluster] = []

    def make(min_nodes: int, max_nodes: int, name: str = "c") -> Cluster:
        directory = tmp_path / name
        directory.mkdir()
        made.append(Cluster(directory, min_nodes, max_nodes))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


@contextlib.contextmanager
def diagnosed(cluster: Cluster) -> Iterator[None]:
    """On failure, append the store's and agents' logs to the assertion."""
    try:
        yield
    except AssertionError as err:
        raise AssertionError(f"{err}\n{cluster.diagnostics()}") from None


def running(cluster: Cluster, addrs, **env) -> dict:
    """Starts the store and agents; returns the store's state once they all train in one round."""
    cluster.start_store()
    for addr in addrs:
        cluster.start_agent(addr, **env)
    cluster.wait_for_world(len(addrs), timeout=FIRST_WORLD_TIMEOUT)
    return cluster.wait_for_round(len(addrs))


def complete_when_all_joined(cluster: Cluster, live: int, old_round: int, timeout: float = 60) -> float | None:
    """The operator's loop: POST /v1/complete until the survivors' round is complete. Returns when the store
    first accepted (unix time), None when the agents completed it by themselves first."""
    accepted: list[float] = []

    def attempt():
        if cluster.store.api("POST", "/v1/complete", {"liveNodes": live})["completed"] and not accepted:
            accepted.append(now())
        return cluster.store.state()

    wait_for(attempt, timeout, f"round after {old_round} complete with {live} nodes", interval=0.1,
             until=lambda s: s["complete"] and s["round"] > old_round and len(s["participants"]) == live)
    return accepted[0] if accepted else None


# ---------------------------------------------------------------- (a) a killed node


def kill_and_recover(cluster: Cluster, nudge: bool) -> dict[str, float]:
    """SIGKILL one node's whole tree; with `nudge`, remove it at once and complete the survivors' round."""
    formed = running(cluster, ADDRS)
    victim = cluster.agents[-1]
    killed_at = now()
    victim.kill()
    times: dict[str, float] = {}
    if nudge:
        answer = cluster.store.api("POST", "/v1/remove", {"addr": victim.addr, "heartbeatBefore": killed_at})
        times["removed"] = now() - killed_at
        assert [node["addr"] for node in answer["removed"]] == [victim.addr] and answer["refused"] is None
        state = cluster.store.state()
        assert victim.addr not in [p["addr"] for p in state["participants"]]
        accepted = complete_when_all_joined(cluster, 2, formed["round"])
        if accepted is not None:
            times["complete_accepted"] = accepted - killed_at
    state = cluster.wait_for_round(2, after_round=formed["round"])
    times["round_complete"] = now() - killed_at
    assert sorted(p["addr"] for p in state["participants"]) == list(ADDRS[:2])
    times["first_step_world_2"] = cluster.wait_for_world(2, after=killed_at)["time"] - killed_at
    assert state["failureRounds"] == 0, "a lost node is a membership change, not a failure"
    return times


def test_killed_node_removed_and_round_completed_at_once(clusters):
    cluster = clusters(2, 3)
    with diagnosed(cluster):
        times = kill_and_recover(cluster, nudge=True)
        print(f"\nkilled node, nudged: {times}")
        # torch alone drops the dead node only after its heartbeats expire (2 s x 3 = 6 s and more).
        assert times["removed"] < 2.0
        # The store ended the last call (2 s) as soon as both survivors had joined, before they did.
        assert "complete_accepted" in times
        assert "remove addr=127.0.0.13" in cluster.store.log() and "[rendezvous store-agents]" in cluster.store.log()


@pytest.mark.slow
def test_killed_node_recovers_sooner_with_the_nudges(clusters):
    base = kill_and_recover(clusters(2, 3, "base"), nudge=False)
    nudged = kill_and_recover(clusters(2, 3, "nudged"), nudge=True)
    print(f"\nkilled node: baseline {base}\nkilled node: nudged   {nudged}")
    # Measured medians are about 4 s apart; the margin leaves room for a busy machine.
    assert nudged["round_complete"] < base["round_complete"] - 1.0
    assert nudged["first_step_world_2"] < base["first_step_world_2"] - 1.0


# ---------------------------------------------------------------- (a') the first round held


def test_a_held_first_round_waits_for_an_agent_that_joins_after_its_last_call(clusters):
    """The operator's hold (planner/first_round.py): round 0's last call (2 s here) kept open while a worker is
    still starting, then ended by complete once both agents are in. torch reads the held deadline at each poll."""
    cluster = clusters(1, 3)
    with diagnosed(cluster):
        store = cluster.start_store()
        cluster.start_agent(ADDRS[0])
        first = wait_for(store.state, FIRST_WORLD_TIMEOUT, "the first agent in round 0", interval=0.05,
                         until=lambda s: s["participants"] and not s["complete"])
        held = store.api("POST", "/v1/hold", {"round": 0, "seconds": 30})
        assert held["changed"] and held["heldUntil"], held
        # The second agent starts once the first one's last call is over: unheld, round 0 would form without it.
        joined_at = now()
        wait_for(lambda: now() > joined_at + 3, 10, "the first agent's last call over", interval=0.1)
        assert not store.state()["complete"], "round 0 formed while held"
        cluster.start_agent(ADDRS[1])
        complete_when_all_joined(cluster, 2, first["round"] - 1, timeout=FIRST_WORLD_TIMEOUT)
        cluster.wait_for_world(2, timeout=FIRST_WORLD_TIMEOUT)
        assert {r["world_size"] for r in cluster.steps()} == {2}, "the job trained before both agents were in"


# ---------------------------------------------------------------- (b) a frozen node


def freeze_and_recover(cluster: Cluster, nudge: bool, pg_timeout: int = 60) -> dict[str, float]:
    """SIGSTOP one node's whole tree (no TCP reset: the survivors hang in the collective)."""
    formed = running(cluster, ADDRS, STORE_TEST_PG_TIMEOUT=str(pg_timeout))
    victim = cluster.agents[-1]
    frozen_at = now()
    victim.freeze()
    times: dict[str, float] = {}
    if nudge:
        answer = cluster.store.api("POST", "/v1/remove", {"addr": victim.addr, "heartbeatBefore": now()})
        assert [node["addr"] for node in answer["removed"]] == [victim.addr]
        answer = cluster.store.api("POST", "/v1/restart", {"round": formed["round"]})
        assert answer["restarting"] is True, answer
        times["restart_requested"] = now() - frozen_at
        complete_when_all_joined(cluster, 2, formed["round"])
    first = cluster.wait_for_world(2, after=frozen_at, timeout=60 if nudge else pg_timeout + 90)
    times["first_step_world_2"] = first["time"] - frozen_at
    state = cluster.store.state()
    assert sorted(p["addr"] for p in state["participants"]) == list(ADDRS[:2])
    if nudge:
        # The waiter went once the round moved on, so it did not restart the new world as well.
        state = wait_for(cluster.store.state, 10, "the waiter removed", until=lambda s: not s["waiterActive"])
        assert state["failureRounds"] == 0
        assert "waiter removed" in cluster.store.log()
    victim.kill()
    return times


def test_frozen_node_removed_and_group_restarted(clusters):
    cluster = clusters(2, 3)
    with diagnosed(cluster):
        times = freeze_and_recover(cluster, nudge=True)
        print(f"\nfrozen node, nudged: {times}")
        # Without the restart the survivors would hang until the process-group timeout (60 s here).
        assert times["first_step_world_2"] < 20
        # Later rounds stay at two: no restart loop from a waiter left behind.
        rounds_then = cluster.store.state()["round"]
        last = cluster.wait_for_world(2, after=now() + 3, timeout=30)
        assert cluster.store.state()["round"] == rounds_then and last["world_size"] == 2


@pytest.mark.slow
def test_frozen_node_baseline_hangs_until_the_process_group_timeout(clusters):
    base = freeze_and_recover(clusters(2, 3, "base"), nudge=False)
    print(f"\nfrozen node: baseline {base}")
    assert base["first_step_world_2"] > 55


# ---------------------------------------------------------------- (c) failure rounds


def test_a_worker_failure_is_a_failure_round_and_a_join_is_not(clusters, tmp_path):
    cluster = clusters(2, 3)
    with diagnosed(cluster):
        formed = running(cluster, ADDRS[:2], STORE_TEST_FAIL_ONCE=str(tmp_path / "failed-once"))
        assert formed["failureRounds"] == 0
        state = wait_for(cluster.store.state, 90, "the failure round", interval=0.2,
                         until=lambda s: s["failureRounds"] >= 1 and s["complete"])
        assert state["failureRounds"] == 1 and state["lastFailureRoundAt"] is not None
        assert state["rounds"][-1]["nodes"] == list(ADDRS[:2]) and state["rounds"][-1]["round"] > formed["round"]
        resumed = cluster.wait_for_world(2, after=state["lastFailureRoundAt"])
        assert resumed["restart"] >= 1 or any(r["restart"] >= 1 for r in cluster.steps())
        # Scale up: a third node joins. The set changes: a membership change, not charged.
        joined_from = state["round"]
        cluster.start_agent(ADDRS[2])
        state = cluster.wait_for_round(3, after_round=joined_from, timeout=FIRST_WORLD_TIMEOUT)
        cluster.wait_for_world(3, timeout=60)
        state = cluster.store.state()
        assert state["failureRounds"] == 1
        assert state["rounds"][-1]["nodes"] == list(ADDRS)
        assert "failure round" in cluster.store.log()


# ---------------------------------------------------------------- (d) a refused removal


def test_removing_the_only_node_of_a_running_round_is_refused(clusters):
    cluster = clusters(1, 2)
    with diagnosed(cluster):
        formed = running(cluster, ADDRS[:1])
        asked_at = now()
        answer = cluster.store.api("POST", "/v1/remove", {"addr": ADDRS[0], "heartbeatBefore": asked_at + 1})
        assert answer["removed"] == [] and "would empty complete round" in answer["refused"]
        state = cluster.store.state()
        assert (state["round"], state["complete"]) == (formed["round"], True)
        assert [p["addr"] for p in state["participants"]] == [ADDRS[0]]
        # Training goes on in the same world.
        later = cluster.wait_for_world(1, after=asked_at + 1, timeout=30)
        assert later["step"] > 0 and cluster.store.state()["round"] == formed["round"]


# ---------------------------------------------------------------- (d) a warm spare takes a lost agent's seat


def test_a_warm_spare_waits_outside_the_training_and_takes_the_seat_of_a_killed_agent(clusters):
    """Three kit agents (elasticjob_warm.torchrun, as in the pods) and two seats: one agent waits warm as a spare
    and never trains; the operator's part removes a killed seated agent, and the spare joins the next round, which
    forms at the full size of 2 without a round at 1 between."""
    cluster = clusters(1, 3)
    with diagnosed(cluster):
        store = cluster.start_store(ELASTICJOB_RDZV_SEATS="2")
        for addr in ADDRS:
            cluster.start_agent(addr, warm=True, ELASTICJOB_SEATS="1")
        formed = wait_for(store.state, FIRST_WORLD_TIMEOUT, "two agents seated and trained, one a spare",
                          interval=0.2, until=lambda s: s["complete"] and len(s["participants"]) == 2
                          and s["seats"] and len(s["seats"]["spares"]) == 1)
        cluster.wait_for_world(2, timeout=FIRST_WORLD_TIMEOUT)
        spare = formed["seats"]["spares"][0]
        victim = next(a for a in cluster.agents if a.addr != spare)
        killed_at = now()
        victim.kill()
        answer = store.api("POST", "/v1/remove", {"addr": victim.addr, "heartbeatBefore": killed_at})
        assert [node["addr"] for node in answer["removed"]] == [victim.addr]
        complete_when_all_joined(cluster, 2, formed["round"])
        state = cluster.wait_for_round(2, after_round=formed["round"])
        assert spare in [p["addr"] for p in state["participants"]]
        first = cluster.wait_for_world(2, after=killed_at)
        print(f"\nwarm spare: the first step at world size 2 {first['time'] - killed_at:.2f} s after the kill")
        assert {r["world_size"] for r in cluster.steps()} == {2}, "a round formed below its seats"
        assert {r["node"] for r in cluster.steps() if r["time"] < killed_at} == set(ADDRS) - {spare}, \
            "the spare trained before it had a seat"
        assert f"seat granted to the spare at {spare}" in store.log()
