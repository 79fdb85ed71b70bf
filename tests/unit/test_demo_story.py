"""`make run`'s live view and summary, from made-up snapshots: what each line says, and what each fault cost."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from rich.console import Console

from localcluster import liveview, story
from localcluster.liveview import Snapshot


def pod(name: str, phase: str = "Running", running: bool = True, deleting: bool = False) -> dict:
    state = {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}
    meta = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [{"state": state}]}}


def record(step: int, rank: int, world: int, t: float, host: str = "w-0", pid: int = 10) -> dict:
    return {"step": step, "rank": rank, "world_size": world, "time": t, "host": host, "pid": pid, "started": 1.0}


def event(reason: str, message: str, stamp: str, uid: str) -> dict:
    return {"metadata": {"name": uid, "uid": uid}, "reason": reason, "message": message, "type": "Normal",
            "lastTimestamp": stamp, "involvedObject": {}}


@pytest.mark.parametrize("pods, expected", [
    ([], "none"),
    ([pod("a"), pod("b"), pod("c", running=False)], "2 running, 1 starting"),
    ([pod("a", deleting=True), pod("b", "Failed", False), pod("c", "Succeeded", False)],
     "1 terminating, 1 succeeded, 1 failed"),
])
def test_workers_by_state(pods, expected):
    assert liveview.workers(pods) == expected


def test_snapshot_reads_the_latest_step_whatever_the_order():
    snap = Snapshot({"phase": "Running"}, [], [], [record(5, 0, 2, 10.0), record(7, 1, 3, 12.0), record(6, 0, 3, 11.0)])
    assert (snap.step, snap.world_size) == (7, 3)
    assert Snapshot({}, [], [], []).phase == "Pending"


def test_progress_lines_being_written_are_skipped(tmp_path):
    path = tmp_path / "progress.jsonl"
    path.write_text('{"step": 1, "time": 1}\n{"step": 2, "ti')
    assert liveview.read_records(path) == [{"step": 1, "time": 1}]
    assert liveview.read_records(tmp_path / "missing.jsonl") == []


def plain_view() -> tuple[liveview.View, io.StringIO]:
    out = io.StringIO()
    return liveview.View("default/ddp", Console(file=out, width=200, force_terminal=False)), out


def test_plain_output_prints_changes_and_each_event_once(monkeypatch):
    view, out = plain_view()
    clock = iter([100.0, 100.5, 101.0, 107.0])
    monkeypatch.setattr(liveview.time, "monotonic", lambda: next(clock))
    events = [event("CreatedWorker", "created worker pod ddp-worker-0", "2026-01-01T10:00:01Z", "e1")]
    with view:
        assert not view.interactive
        view.update(Snapshot({"phase": "Running"}, [pod("a")], events, [record(1, 0, 1, 1.0)]))
        view.update(Snapshot({"phase": "Running"}, [pod("a")], events, [record(2, 0, 1, 2.0)]))  # only a step: held
        view.update(Snapshot({"phase": "Running", "restarts": 1}, [pod("a")], events, [record(3, 0, 1, 3.0)]))
        view.update(Snapshot({"phase": "Running", "restarts": 1}, [pod("a")], events, [record(9, 0, 1, 9.0)]))
    lines = out.getvalue().splitlines()
    assert sum("CreatedWorker" in line for line in lines) == 1
    steps = [line for line in lines if "world size" in line]
    assert ["step 1 " in steps[0], "restarts 1" in steps[1], "step 9 " in steps[2]] == [True] * 3 and len(steps) == 3


def test_final_frame_shows_phase_world_size_step_restarts_and_events():
    view, out = plain_view()
    view.update(Snapshot({"phase": "Succeeded", "restarts": 1, "infrastructureFailures": 0}, [pod("a", "Succeeded",
                         False)], [event("Succeeded", "3 worker pod(s) completed", "2026-01-01T10:00:09Z", "e")],
                         [record(60, 0, 3, 9.0)]))
    view.final_frame()
    text = out.getvalue()
    for expected in ("Succeeded", "1 succeeded", "world size     3", "training step  60", "1 charged",
                     "3 worker pod(s) completed"):
        assert expected in text, text


def test_the_first_step_after_a_fault_is_a_new_process():
    records = [record(5, 0, 2, 10.0, "w-0", 1), record(6, 0, 2, 11.5, "w-0", 1),  # a survivor finishing its step
               record(1, 0, 3, 14.0, "w-0", 2), record(1, 1, 3, 13.9, "w-1", 3)]
    assert story.first_step_after(records, 11.0)["time"] == 13.9
    assert story.first_step_after(records, 11.0, world_size=2) is None


def test_a_lost_store_costs_the_longest_pause_in_rank_0s_steps_until_a_new_one_serves():
    records = [record(5, 0, 2, 10.0, "w-0", 1), record(6, 0, 2, 10.3, "w-0", 1), record(6, 1, 2, 10.35, "w-1", 4),
               record(7, 0, 2, 11.2, "w-0", 1), record(8, 0, 2, 11.5, "w-0", 1), record(9, 0, 2, 20.0, "w-0", 1)]
    assert round(story.longest_pause(records, 10.1, 12.0), 2) == 0.9  # 10.3 -> 11.2; rank 1 and 20.0 not counted
    assert story.longest_pause(records, 10.1, 10.2) == 0.0
    assert story.store_back({"rendezvous": {"ready": True, "restarts": 1}}, 0)
    assert not story.store_back({"rendezvous": {"ready": True, "restarts": 1}}, 1), "the loss not counted yet"
    assert not story.store_back({"rendezvous": {"ready": False, "restarts": 1}}, 0)


def test_each_failure_on_record_goes_to_the_fault_that_caused_it():
    """By the pod it killed, by its kind (RendezvousLost: the store), else by time; times have whole seconds, and
    the operator may record a failure after the next fault began."""
    base = 1_800_000_000.0
    faults = [story.Fault("scale", base + 47.3), story.Fault("kill rank 0", base + 58.4, pod_uid="u-0"),
              story.Fault("kill store", base + 67.2, owns=("RendezvousLost",))]

    def stamp(seconds: float) -> str:
        return datetime.fromtimestamp(base + seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    status = {"restarts": 2, "lastFailures": [
        {"reason": "Killed", "uid": "u-0", "charged": True, "time": stamp(58.9)},
        {"reason": "Error", "uid": "u-2", "charged": True, "time": stamp(60.2)},  # in place, a survivor's agent
        *({"reason": "RendezvousLost", "uid": f"s-{i}", "charged": False, "time": stamp(68.1)} for i in range(3)),
        {"reason": "Error", "uid": "u-0", "charged": False, "time": stamp(69.0)}]}  # late, but its pod says whose
    story.settle(faults, status)
    assert [f.charged for f in faults] == [0, 2, 0]
    assert [f.reasons for f in faults] == [(), ("Killed", "Error", "Error (not charged)"),
                                           ("RendezvousLost (not charged)",) * 3]
    out = io.StringIO()
    Console(file=out, width=200).print(story.summary(faults))
    text = out.getvalue()
    assert "yes, 2 restarts (Killed, Error, Error (not charged))" in text, text
    assert "no (3 x RendezvousLost (not charged))" in text, text
