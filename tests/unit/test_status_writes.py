"""When a reconcile writes status at once and when it may wait a moment, and Events merged per reason."""

from __future__ import annotations

import time

from elasticjob import planner
from elasticjob.handlers.apply import merged
from elasticjob.handlers.context import JobMemory
from elasticjob.handlers.reconcile import STATUS_INTERVAL, status_deferral
from elasticjob.models import ElasticJobStatus, FailureRecord, Phase


def status(**fields) -> ElasticJobStatus:
    return ElasticJobStatus(**{"phase": Phase.RUNNING, "replicas": 2, "ready_replicas": 2, **fields})


def written(ago: float) -> JobMemory:
    return JobMemory(status_written_at=time.monotonic() - ago)


def test_the_first_write_of_a_loop_goes_out_at_once():
    assert status_deferral(JobMemory(), status(), status(ready_replicas=1)) is None


def test_pod_counts_and_the_message_wait_while_the_last_write_is_recent():
    wait = status_deferral(written(0.2), status(), status(ready_replicas=1, message="1/2 ready"))
    assert wait is not None and 0 < wait <= STATUS_INTERVAL


def test_nothing_waits_once_the_interval_has_passed():
    assert status_deferral(written(STATUS_INTERVAL + 0.1), status(), status(ready_replicas=1)) is None


def test_the_phase_and_everything_counted_or_remembered_go_out_at_once():
    old = status()
    failure = FailureRecord(pod="p", uid="u", reason="Error", charged=True, time="2026-01-01T00:00:00Z")
    for new in (status(phase=Phase.RESTARTING), status(restarts=1), status(infrastructure_failures=1),
                status(counted_failures=["u"]), status(last_failures=[failure])):
        assert status_deferral(written(0.1), old, new) is None, new
    ready = status()
    ready.rendezvous.ready = True
    assert status_deferral(written(0.1), old, ready) is None  # a store lost later is counted against it
    endpoint = status()
    endpoint.rendezvous.endpoint = "10.96.0.1:29400"
    assert status_deferral(written(0.1), old, endpoint) is None


def test_the_stores_round_waits():
    new = status()
    new.rendezvous.round, new.rendezvous.nodes = 3, ["a", "b"]
    assert status_deferral(written(0.1), status(), new) is not None


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
