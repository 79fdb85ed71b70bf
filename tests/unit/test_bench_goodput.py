"""bench/goodput.py's arithmetic (bench/goodput_measure.py): ETTR from the training's step records with steps
recomputed after a restore, the ledger's incidents gathered and summed per phase, and the faults in turn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import goodput_measure as gm  # noqa: E402

STEP = 0.1


def steps(first: int, last: int, at: float, pid: int = 1, host: str = "train-worker-0", rank: int = 0) -> list[dict]:
    """Rank `rank`'s records of steps first..last by one process, one every STEP seconds from `at`."""
    return [{"step": n, "rank": rank, "host": host, "pid": pid, "started": at - 1, "time": round(at + i * STEP, 3)}
            for i, n in enumerate(range(first, last + 1))]


def test_a_run_without_faults_spends_all_its_time_on_steps():
    records = steps(1, 101, 0.0)
    assert gm.ettr(records, 0.0, 10.0) == pytest.approx(100.0)


def test_steps_done_again_after_a_restore_are_lost_and_so_is_the_gap():
    # Steps 1-50 from t=0 (to 4.9), a fault, a restart at t=7.0 that restored step 40 and did 41-50 again.
    before = steps(1, 50, 0.0)
    after = steps(41, 100, 7.0, pid=2)
    records = before + after
    # Counted: 1-40 of the first process (4.0 s, from -0.1), and 41-100 of the second (6.0 s).
    assert gm.productive_seconds(records, 0.0, 12.9) == pytest.approx(4.0 - 0.1 + 6.0)
    lost = 12.9 - gm.productive_seconds(records, 0.0, 12.9)
    recomputed = 10 * STEP  # steps 41-50 the first time
    gap = 7.0 - 4.9 - STEP  # the new process's first step took the typical step time; before it, start-up
    assert lost == pytest.approx(recomputed + gap, abs=1e-6)


def test_other_ranks_records_do_not_count_twice():
    records = steps(1, 101, 0.0) + steps(1, 101, 0.0, host="train-worker-1", rank=1)
    assert gm.ettr(records, 0.0, 10.0) == pytest.approx(100.0)


def test_loss_is_split_by_fault():
    records = steps(1, 50, 0.0) + steps(41, 200, 7.0, pid=2)
    faults = [gm.Fault(4.95, "rank0"), gm.Fault(15.0, "scale")]
    found = gm.lost_per_fault(records, 0.0, 22.0, faults)
    assert [kind for kind, _ in found] == ["rank0", "scale"]
    # The steps recomputed ran before the fault, the gap after it: both are the first fault's.
    assert found[0][1] == pytest.approx(10 * STEP + (7.0 - 4.9 - STEP), abs=1e-6)
    assert found[1][1] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("minutes", "every", "kinds", "expected"), [
    (20, 2, gm.KINDS, [(120 * k, gm.KINDS[(k - 1) % 7]) for k in range(1, 10)]),
    (4, 1.5, gm.QUICK_KINDS, [(90, "rank0"), (180, "partition")]),
    (10, 2, ("worker", "rank0"), [(120, "worker"), (240, "rank0"), (360, "worker"), (480, "rank0")]),
    (1, 2, gm.KINDS, []),
])
def test_faults_come_in_turn_inside_the_window(minutes, every, kinds, expected):
    assert [(f.at, f.kind) for f in gm.rotation(minutes, every, kinds)] == expected


def incident(kind: str, start: str, lost: float, **phases: float | None) -> dict:
    return {"kind": kind, "startTime": start, "lostSeconds": lost, "phases": phases}


def test_incidents_are_gathered_once_across_reads_and_summed_per_phase():
    first = incident("Rank0Lost", "2026-01-01T00:02:00.000Z", 4.0, detect=1.0, replace=1.5, rendezvous=0.5,
                     workerStart=0.5, checkpointLoad=0.2, recompute=0.3)
    second = incident("Partition", "2026-01-01T00:04:00.000Z", 6.0, detect=4.0, replace=2.0, rendezvous=None,
                      workerStart=None, checkpointLoad=None, recompute=None)
    seen: dict = {}
    gm.gather(seen, {"lastIncidents": [first]})
    gm.gather(seen, {"lastIncidents": [first, second]})
    incidents = list(seen.values())
    assert len(incidents) == 2
    sums = gm.phase_sums(incidents)
    assert sums == {"detect": 5.0, "replace": 3.5, "rendezvous": 0.5, "workerStart": 0.5, "checkpointLoad": 0.2,
                    "recompute": 0.3}
    assert gm.ledger_lost(incidents) == 10.0
    start = gm.parse_time("2026-01-01T00:03:00Z")
    assert gm.in_window(incidents, start, start + 600) == [second]


def test_a_phase_no_incident_knew_is_unknown_not_zero():
    sums = gm.phase_sums([incident("StoreLost", "2026-01-01T00:00:00Z", 1.0, detect=1.0)])
    assert sums["detect"] == 1.0 and sums["recompute"] is None


@pytest.mark.parametrize(("measured", "ledger", "agrees"), [
    (10.0, 10.9, True), (10.0, 9.1, True), (10.0, 11.2, False), (10.0, 8.5, False), (0.0, 0.0, True),
])
def test_the_ledger_agrees_within_ten_percent(measured, ledger, agrees):
    assert gm.agrees(measured, ledger) is agrees


def test_the_summary_shows_a_setup_without_a_ledger_as_such():
    results = [gm.Result("operator", 600, 97.5, 15.0, [("rank0", 5.0)], [incident("Rank0Lost", "x", 14.0)], []),
               gm.Result("by hand", 600, 80.0, 120.0, [("rank0", 60.0)], None, ["preemption"])]
    rows = gm.summary_rows(results)
    assert rows[1][:5] == ["operator", "97.50", "15.0", "14.0 (1)", "yes"]
    assert rows[2][:5] == ["by hand", "80.00", "120.0", "-", "-"] and rows[2][-1] == "preemption"
    assert gm.per_kind_rows(results)[1] == ["rank0", "5.0 (1)", "60.0 (1)"]


def test_each_incident_is_listed_in_time_order_with_its_phases():
    later = incident("Partition", "2026-01-01T00:04:00.000Z", 6.0, detect=4.0, replace=2.0)
    earlier = incident("Rank0Lost", "2026-01-01T00:02:00.500Z", 4.0, detect=1.0, rendezvous=0.5)
    result = gm.Result("operator", 600, 98.0, 10.0, [], [later, earlier], [])
    rows = gm.incident_rows(result, gm.parse_time("2026-01-01T00:00:00Z"))
    assert rows[1] == ["120.5", "Rank0Lost", "", "4.0", "1.0", "-", "0.5", "-", "-", "-"]
    assert rows[2][:5] == ["240.0", "Partition", "", "6.0", "4.0"]


def test_the_by_hand_setup_is_valid_kubernetes_with_the_rendezvous_on_pod_0():
    import kubernetes_validate
    from test_chart import KUBE_VERSION

    from goodput_setups import ByHand

    service, stateful_set = ByHand("by hand", kueue=False).objects("bench-goodput-x")
    for obj in (service, stateful_set):
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    command = stateful_set["spec"]["template"]["spec"]["containers"][0]["command"]
    # Pod 0's name as its own /etc/hosts has it: its agent hosts torch's store, the others reach it there.
    assert f"--rdzv-endpoint={stateful_set['metadata']['name']}-0.{service['metadata']['name']}" \
           ".$(POD_NAMESPACE).svc.cluster.local:29400" in command
    assert stateful_set["spec"]["serviceName"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert "--step-seconds=0.1" in command and "--checkpoint-every=10" in command
