"""When a reconcile writes status at once and when it may wait a moment, and Events merged per reason."""

from __future__ import annotations

import time

from elasticjob import planner
from elasticjob.controller.apply import merged
from elasticjob.controller.context import JobMemory
from elasticjob.controller.reconcile import STATUS_BATCH, STATUS_INTERVAL, status_deferral
from elasticjob.models import Condition, ElasticJobStatus, FailureRecord, Phase


def status(**fields) -> ElasticJobStatus:
    """A status the operator has written before (a reason, a start time)."""
    return ElasticJobStatus(**{"phase": Phase.RUNNING, "reason": "Running", "start_time": "2026-01-01T00:00:00Z",
                               "replicas": 2, "ready_replicas": 2, **fields})


def written(ago: float, held: float | None = None) -> JobMemory:
    now = time.monotonic()
    return JobMemory(status_written_at=now - ago, status_held_since=None if held is None else now - held)


def test_a_change_that_may_wait_is_held_for_the_batch_even_in_a_fresh_loop():
    wait = status_deferral(JobMemory(), status(), status(ready_replicas=1))
    assert wait is not None and 0 < wait <= STATUS_BATCH


def test_a_held_change_waits_from_when_it_was_first_held_not_from_the_latest_change():
    memory = written(STATUS_INTERVAL + 5)
    first = status_deferral(memory, status(), status(ready_replicas=1))
    memory.status_held_since -= STATUS_BATCH  # the batch has passed since the first change was held
    assert first is not None and status_deferral(memory, status(), status(ready_replicas=0)) is None


def test_pod_counts_and_the_message_wait_while_the_last_write_is_recent():
    wait = status_deferral(written(0.2, held=STATUS_BATCH), status(), status(ready_replicas=1, message="1/2 ready"))
    assert wait is not None and 0 < wait <= STATUS_INTERVAL


def test_nothing_waits_once_the_batch_and_the_interval_have_passed():
    memory = written(STATUS_INTERVAL + 0.1, held=STATUS_BATCH + 0.1)
    assert status_deferral(memory, status(), status(ready_replicas=1)) is None


def test_no_change_is_not_held():
    memory = JobMemory()
    assert status_deferral(memory, status(), status()) is None and memory.status_held_since is None


def test_the_phase_and_everything_counted_or_remembered_go_out_at_once():
    old = status()
    failure = FailureRecord(pod="p", uid="u", reason="Error", charged=True, time="2026-01-01T00:00:00Z")
    for new in (status(phase=Phase.RESTARTING), status(restarts=1), status(infrastructure_failures=1),
                status(counted_failures=["u"]), status(last_failures=[failure])):
        assert status_deferral(written(0.1), old, new) is None, new
    ready = status()
    ready.rendezvous.ready = True
    assert status_deferral(written(0.1), old, ready) is None  # a store lost later is counted against it
    counted = status()
    counted.rendezvous.epoch, counted.rendezvous.failure_rounds = "e2", 1
    assert status_deferral(written(0.1), old, counted) is None


def test_a_new_jobs_first_status_goes_out_before_it_acts():
    """The first write is the reconcile's fence: a 409 tells it the body it planned from is stale (another
    replica, or a status patched meanwhile) before it creates anything."""
    new = status(phase=Phase.PENDING, reason="Waiting")
    assert status_deferral(JobMemory(), ElasticJobStatus(), new) is None


def test_the_stores_identity_alone_never_makes_a_write():
    new = status()
    new.rendezvous.epoch = "e2"
    memory = written(STATUS_INTERVAL + 5)
    assert status_deferral(memory, status(), new) == float("inf") and memory.status_held_since is None
    new.ready_replicas = 1  # with something else, it goes out with the batch
    assert status_deferral(memory, status(), new) <= STATUS_BATCH


def test_the_stores_round_address_and_identity_wait():
    new = status()
    new.rendezvous.round, new.rendezvous.nodes = 3, 2
    new.rendezvous.endpoint, new.rendezvous.epoch = "10.96.0.1:29400", "e2"
    assert status_deferral(written(0.1), status(), new) is not None


def test_the_services_uid_waits_its_serial_does_not():
    """The uid rides with the next write (the job's third write at start is gone); the serial of a making goes
    out before it is made, so a copy of an earlier making is refused whether the uid went out or not."""
    seen = status()
    seen.rendezvous.service_uid = "uid-s"
    assert status_deferral(written(0.1), status(), seen) is not None
    again = status()
    again.rendezvous.service_serial = 2
    assert status_deferral(written(0.1), seen, again) is None


def running(message: str, state: bool = True) -> ElasticJobStatus:
    condition = Condition(type="Running", status="True" if state else "False", reason="Running",
                          message=message, last_transition_time="2026-01-01T00:00:00Z")
    return status(conditions=[condition])


def test_a_conditions_message_waits_its_status_does_not():
    assert status_deferral(written(0.1), running("1/2 workers ready"), running("2/2 workers ready")) is not None
    assert status_deferral(written(0.1), running("2/2 workers ready"), running("", state=False)) is None


def test_events_of_one_reason_go_out_as_one_naming_each():
    events = [planner.Event("Normal", "CreatedWorker", f"created worker pod j-worker-{i}") for i in range(3)]
    events.append(planner.Event("Normal", "RendezvousCreated", "created Service j-rendezvous"))
    out = merged(events)
    assert [e.reason for e in out] == ["CreatedWorker", "RendezvousCreated"]
    assert out[0].message == "created worker pod j-worker-0; created worker pod j-worker-1; " \
                             "created worker pod j-worker-2"


def test_a_merged_message_fits_an_event():
    events = [planner.Event("Warning", "WorkerFailed", "x" * 400) for _ in range(5)]
    assert len(merged(events)[0].message) <= 1024
