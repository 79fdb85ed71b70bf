"""How long the operator waits before trying again, every kind of retry in one place (as controller-runtime's
reconcile.Result and its rate limiter keep them together). Seconds."""

from __future__ import annotations

from collections.abc import Sequence

# A job's reconcile that failed (an API error, or something unexpected): the Nth failure in a row waits the Nth
# step, the last one thereafter; a reconcile that succeeds starts the count again (controller/loops.py). Per job,
# as controller-runtime's per-item rate limiter: one failing job backs off, the others are not slowed. A watch
# event still wakes the job at once: it is news, and a reconcile is level-based.
RECONCILE_FAILED = (1, 2, 4, 8, 16, 32, 64, 128, 256, 300)
# Creating a job's objects again after the API server refused them (quota, Pod Security, a webhook): the Nth
# refusal in a row waits the Nth step, the last one thereafter.
REFUSED_CREATE = (2, 4, 8, 15, 30, 60, 120, 300)
# The long-poll on a job's store after the Nth failure in a row (rendezvous_client.py). Its watch stops while the
# store pod is not Ready and starts afresh when it is, so a store that comes back is asked at once; the long steps
# are for a Ready pod whose control port does not answer (a NetworkPolicy that shuts the operator out; kwok's
# fake pods): asked every 5 s, 10,000 of them cost the operator more CPU than the rest of its work. The last step
# is an idle long-poll's length (rendezvous_client.LONG_POLL_SECONDS): a store that does not answer costs no more
# than one that does.
STORE_POLL = (0.5, 1, 2, 5, 10, 30, 60)
# Asking discovery again at start until it answers whether Kueue is there (kueue/discovery.py).
KUEUE_DISCOVERY = 2.0


def step(schedule: Sequence[float], attempt: int) -> float:
    """The wait before attempt `attempt` (0: the first retry); past the end of the schedule, its last step."""
    return schedule[min(max(attempt, 0), len(schedule) - 1)]
