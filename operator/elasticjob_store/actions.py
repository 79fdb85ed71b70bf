"""What the store may do to torch's rendezvous state: pure functions of a decoded state, no I/O.

Each action returns a new state (or None: nothing to write) and what happened, and never changes its input:
the caller writes the new state with compare_set against the bytes it read, and reruns the action on the
newer state when an agent wrote first (control.py). Every rule mirrors a code path of torch's own agents
(dynamic_rendezvous.py), so the agents read our writes as if one of them had made them.
"""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from elasticjob_store.state import NodeDesc, RendezvousState

# The synthetic node put in the wait list to make running agents restart their workers. Not an IP address,
# so no pod (whose --local-addr is its IP) can ever have it.
WAITER = NodeDesc(addr="elasticjob-restart", pid=0, local_id=0)
# How far before "now" complete_round puts the deadline: agents compare it with their own clocks.
CLOCK_SKEW = timedelta(seconds=60)


@dataclass(frozen=True)
class Outcome:
    """What an action did. `state` is None when there is nothing to write."""

    state: RendezvousState | None
    done: bool
    reason: str
    nodes: tuple[NodeDesc, ...] = field(default=())
    refused: bool = False  # the action would have been unsafe (not merely unneeded)


def same_address(a: str, b: str) -> bool:
    """Addresses compare as IPs when both parse (so "::1" equals "0:0:0:0:0:0:0:1"), else as strings."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def _remove_participant_epilogue(state: RendezvousState, min_nodes: int) -> None:
    # torch's _remove_participant_epilogue, shared by its _sanitize and _remove_from_participants.
    if state.complete:
        if not state.participants:
            state.complete = False
            state.round += 1
    elif len(state.participants) < min_nodes:
        state.deadline = None


def remove_node(state: RendezvousState | None, addr: str, heartbeat_before: datetime, min_nodes: int,
                members: tuple[str, ...] | None = None) -> Outcome:
    """Removes every node at `addr` whose last heartbeat is older than `heartbeat_before`, as _sanitize does.

    `heartbeat_before` is when the operator knows the pod's processes stopped: a newer heartbeat comes from a
    replacement pod that reused the IP, which is alive. A node without a heartbeat entry has shown no life and
    goes. Refuses, changing nothing, when the removal would empty a complete round that no participant has
    left: the agents of a complete round leave it themselves when they restart, so emptying a round all of
    whose members are still in it means the evidence is wrong, and a newcomer would then form a second world
    beside the running one (seen in measurements). `members` are the round's participants when it completed
    (unknown: assume no one left); once one of them has left, the survivors are restarting and the last one
    may go.
    """
    if state is None:
        return Outcome(None, False, "no rendezvous state yet")
    everyone = set(state.participants) | state.wait_list | state.redundancy_list | set(state.last_heartbeats)
    dead = sorted(node for node in everyone if same_address(node.addr, addr)
                  and (node not in state.last_heartbeats or state.last_heartbeats[node] < heartbeat_before))
    if not dead:
        alive = sum(1 for node in everyone if same_address(node.addr, addr))
        why = f"{alive} node(s) at {addr} heartbeat after that time" if alive else f"no node at {addr}"
        return Outcome(None, False, why)
    if state.complete and state.participants and set(state.participants) <= set(dead) and not _someone_left(
            state, members):
        return Outcome(None, False, f"removing {len(dead)} node(s) at {addr} would empty complete round "
                                    f"{state.round}, which no participant has left", refused=True)
    new = copy.deepcopy(state)
    participant_removed = False
    for node in dead:  # the body of torch's _sanitize loop
        new.last_heartbeats.pop(node, None)
        if new.participants.pop(node, None) is not None:
            participant_removed = True
        new.wait_list.discard(node)
        new.redundancy_list.discard(node)
    if participant_removed:
        _remove_participant_epilogue(new, min_nodes)
    return Outcome(new, True, f"removed {len(dead)} node(s) at {addr}", tuple(dead))


def _someone_left(state: RendezvousState, members: tuple[str, ...] | None) -> bool:
    return members is not None and len(state.participants) < len(members)


def complete_round(state: RendezvousState | None, live_nodes: int, min_nodes: int, max_nodes: int,
                   now: datetime) -> Outcome:
    """Ends the last-call wait at once when every live node has joined.

    torch's join op marks a round complete when a participant polls (about once a second) and finds the
    deadline passed, with min..max participants; it assigns the ranks then. Moving the deadline into the past
    takes that same path, only without waiting out last_call_timeout for nodes that will not come.
    """
    if state is None:
        return Outcome(None, False, "no rendezvous state yet")
    count = len(state.participants)
    if state.closed:
        return Outcome(None, False, "the rendezvous is closed")
    if state.complete:
        return Outcome(None, False, f"round {state.round} is already complete")
    if count < min_nodes:
        return Outcome(None, False, f"{count} participant(s), fewer than the {min_nodes} needed")
    if count > max_nodes:
        return Outcome(None, False, f"{count} participant(s), more than the {max_nodes} allowed")
    if count != live_nodes:
        return Outcome(None, False, f"{count} participant(s) but {live_nodes} live node(s)")
    if state.deadline is not None and state.deadline <= now - CLOCK_SKEW:
        return Outcome(None, True, f"round {state.round}'s deadline has already passed")
    new = copy.deepcopy(state)
    new.deadline = now - CLOCK_SKEW
    return Outcome(new, True, f"round {state.round} completes at the agents' next poll with {count} node(s)")


def hold_round(state: RendezvousState | None, round_seen: int, until: datetime) -> Outcome:
    """Keeps round `round_seen`'s last call open until `until`.

    torch's join op completes a round when a participant polls and finds the deadline passed with min..max
    participants (or at once at max). Its deadline is set when the min-th node joins, and every agent reads it
    from the state at each poll: a later deadline makes them wait on for the nodes still coming, as a longer
    last call would. `done`: the round's last call lasts until `until` at least."""
    if state is None:
        return Outcome(None, False, "no rendezvous state yet")
    if state.closed:
        return Outcome(None, False, "the rendezvous is closed")
    if state.round != round_seen:
        return Outcome(None, False, f"round {state.round} is not round {round_seen}")
    if state.complete:
        return Outcome(None, False, f"round {state.round} is already complete")
    if state.deadline is None:
        return Outcome(None, False, f"round {state.round} has no last call yet (fewer than its minimum joined)")
    if state.deadline >= until:
        return Outcome(None, True, f"round {state.round}'s last call lasts until {state.deadline:%H:%M:%S} already")
    new = copy.deepcopy(state)
    new.deadline = until
    return Outcome(new, True, f"round {state.round}'s last call held until {until:%H:%M:%S.%f}"[:-3]
                   + f" for {len(state.participants)} participant(s)")


def add_waiter(state: RendezvousState | None, round_seen: int, now: datetime) -> Outcome:
    """Puts WAITER in the wait list so running agents restart their workers, as for a node joining.

    An agent whose workers are healthy restarts them when num_nodes_waiting() > 0, and torch does not charge
    that to --max-restarts (agent/server/api.py, _invoke_run). The heartbeat keeps the agents' _sanitize from
    dropping it at once; it drops it keep_alive_interval x keep_alive_max_attempt later anyway, which bounds
    how long a waiter the store forgot about can live. `round_seen` fences the request: a caller that saw
    another round must look again.
    """
    if state is None:
        return Outcome(None, False, "no rendezvous state yet")
    if state.round != round_seen:
        return Outcome(None, False, f"the round is {state.round}, not {round_seen}")
    if state.closed:
        return Outcome(None, False, "the rendezvous is closed")
    if not state.complete:
        # A waiter now would restart the world that is still forming, once it formed.
        return Outcome(None, False, f"round {state.round} is not complete; its agents are already rendezvousing")
    if WAITER in state.wait_list:
        return Outcome(None, True, f"a restart of round {state.round} is already under way")
    new = copy.deepcopy(state)
    new.wait_list.add(WAITER)
    new.last_heartbeats[WAITER] = now
    return Outcome(new, True, f"agents of round {state.round} restart their workers at their next check")


def remove_waiter(state: RendezvousState | None) -> Outcome:
    """Takes WAITER out again; left in, it would restart the new world too."""
    if state is None or (WAITER not in state.wait_list and WAITER not in state.last_heartbeats):
        return Outcome(None, False, "no waiter")
    new = copy.deepcopy(state)
    new.wait_list.discard(WAITER)
    new.last_heartbeats.pop(WAITER, None)
    return Outcome(new, True, "waiter removed")


def has_waiter(state: RendezvousState | None) -> bool:
    return state is not None and WAITER in state.wait_list


def reopen(state: RendezvousState | None, round_seen: int) -> Outcome:
    """A clean rendezvous after `round_seen`, where that round is closed while the job still trains. torch's
    agents close the rendezvous only when the job is over: the operator asks this only once an agent left on the
    closed round with no worker of it failed and no worker finished (planner/recovery.py), so the closure was
    written by something else, and every agent and replacement would meet it. Agents then join the next round
    as at a first start."""
    if state is None or not state.closed:
        return Outcome(None, False, "the rendezvous is not closed")
    if state.round != round_seen:
        return Outcome(None, False, f"the round is {state.round}, not {round_seen}")
    return Outcome(clean(state.round + 1), True, f"round {state.round} was closed: round {state.round + 1} opened")


def clean(round_number: int) -> RendezvousState:
    """An open rendezvous that no node has joined, at `round_number`."""
    fresh = RendezvousState()
    fresh.round = round_number
    return fresh
