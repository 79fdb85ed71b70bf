"""bench/goodput.py's arithmetic (bench/goodput_measure.py): ETTR from the training's step records with steps
recomputed after a restore, the ledger's incidents gathered and summed per phase, and the faults in turn; and
bench/goodput.py's faults of nodes that stay bad (a sick node, a slow worker) with fakes of the cluster's parts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

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


def test_weighted_a_step_at_2_of_3_nodes_counts_two_thirds():
    # 10 s at world size 3, then 6 s at 2 (a cut-off pod's survivors), then 3 again.
    full = [{**r, "world_size": 3} for r in steps(1, 100, 0.1)]
    short = [{**r, "world_size": 2} for r in steps(101, 160, 10.1)]
    back = [{**r, "world_size": 3} for r in steps(161, 200, 16.1)]
    records = full + short + back
    assert gm.ettr(records, 0.0, 20.0) == pytest.approx(100.0)
    assert gm.ettr(records, 0.0, 20.0, weighted=True) == pytest.approx(100.0 * (20.0 - 6.0 / 3) / 20.0)


def test_loss_is_split_by_fault():
    records = steps(1, 50, 0.0) + steps(41, 200, 7.0, pid=2)
    faults = [gm.Fault(4.95, "rank0"), gm.Fault(15.0, "scale")]
    found = gm.lost_per_fault(records, 0.0, 22.0, faults)
    assert [kind for kind, _ in found] == ["rank0", "scale"]
    # The steps recomputed ran before the fault, the gap after it: both are the first fault's.
    assert found[0][1] == pytest.approx(10 * STEP + (7.0 - 4.9 - STEP), abs=1e-6)
    assert found[1][1] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("minutes", "every", "kinds", "expected"), [
    (20, 2, gm.KINDS, [(120 * k, gm.KINDS[(k - 1) % len(gm.KINDS)]) for k in range(1, 10)]),
    (4, 1.5, gm.QUICK_KINDS, [(90, "rank0"), (180, "partition")]),
    (10, 2, ("worker", "rank0"), [(120, "worker"), (240, "rank0"), (360, "worker"), (480, "rank0")]),
    (1, 2, gm.KINDS, []),
])
def test_faults_come_in_turn_inside_the_window(minutes, every, kinds, expected):
    assert [(f.at, f.kind) for f in gm.rotation(minutes, every, kinds)] == expected


def test_a_full_run_makes_each_kind_once_the_nodes_that_stay_bad_last():
    faults = gm.rotation(20, 2)
    assert sorted(f.kind for f in faults) == sorted(gm.KINDS)
    assert [(f.at, f.kind) for f in faults[-2:]] == [(960, "sick"), (1080, "slow")]


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
    assert sums == {"detect": 5.0, "replace": 3.5, "nodeCheck": None, "rendezvous": 0.5, "workerStart": 0.5,
                    "checkpointLoad": 0.2, "recompute": 0.3}
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
    results[0].weighted = 95.25
    rows = gm.summary_rows(results)
    assert rows[1][:6] == ["operator", "97.50", "95.25", "15.0", "14.0 (1)", "yes"]
    assert rows[2][:6] == ["by hand", "80.00", "-", "120.0", "-", "-"] and rows[2][-1] == "preemption"
    assert gm.per_kind_rows(results)[1] == ["rank0", "5.0 (1)", "60.0 (1)"]


def test_each_incident_is_listed_in_time_order_with_its_phases():
    later = incident("Partition", "2026-01-01T00:04:00.000Z", 6.0, detect=4.0, replace=2.0)
    earlier = incident("Rank0Lost", "2026-01-01T00:02:00.500Z", 4.0, detect=1.0, rendezvous=0.5)
    result = gm.Result("operator", 600, 98.0, 10.0, [], [later, earlier], [])
    rows = gm.incident_rows(result, gm.parse_time("2026-01-01T00:00:00Z"))
    assert rows[1] == ["120.5", "Rank0Lost", "", "4.0", "1.0", "-", "-", "0.5", "-", "-", "-"]
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


def test_every_setup_runs_the_same_training_with_what_the_nodes_that_stay_bad_need():
    from goodput_setups import BAD_NODE_FLAGS, NODE_NAME, ByHand, OperatorJob, sick_marker

    by_hand = ByHand("by hand", kueue=False).objects("bench-goodput-x")[1]["spec"]["template"]["spec"]
    operator = OperatorJob("operator", warm=True, kueue=False).job("bench-goodput-x")["spec"]["template"]["spec"]
    for pod in (by_hand, operator):
        container = pod["containers"][0]
        assert container["command"][-len(BAD_NODE_FLAGS):] == list(BAD_NODE_FLAGS)
        assert NODE_NAME in container["env"]
        # The marker's folder, as the training sees it, is inside the checkpoint hostPath that this machine writes.
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/ckpt")
        host = next(v for v in pod["volumes"] if v["name"] == mount["name"])["hostPath"]["path"]
        marked = container["command"][container["command"].index("--fail-on-marked-node") + 1]
        assert Path(host) / Path(marked).relative_to("/ckpt") / "node-1" == sick_marker("bench-goodput-x", "node-1")
    assert "--forward-matmuls" in BAD_NODE_FLAGS


# --- the faults, with fakes of the cluster's parts: the API server's pods, and the cgroups behind a throttle ---


class FakeCore:
    def __init__(self, pods: dict[str, tuple[str, str]]):
        self.pods = pods  # name: (node, uid)

    def read_namespaced_pod(self, name: str, namespace: str) -> SimpleNamespace:
        if name not in self.pods:
            raise ApiException(status=404)
        node, uid = self.pods[name]
        return SimpleNamespace(spec=SimpleNamespace(node_name=node), metadata=SimpleNamespace(uid=uid))


class FakeApi:
    def __init__(self, pods: dict[str, tuple[str, str]]):
        self.core = FakeCore(pods)


class FakeSetup:
    def __init__(self, store_pod: str, workers: list[str]):
        self.store_pod, self._workers = store_pod, workers

    def workers(self, api, ns: str) -> list[str]:
        return self._workers

    def preempt(self, api, ns: str):
        return None  # no Kueue


@pytest.fixture
def goodput(tmp_path, monkeypatch):
    """bench/goodput.py with the training's records and the checkpoint dirs in tmp_path."""
    import goodput as module
    import goodput_setups
    import recovery

    monkeypatch.setattr(recovery, "HOST_DIR", tmp_path)
    monkeypatch.setattr(goodput_setups, "HOST_DIR", tmp_path)
    return module


def rank0_on(tmp_path: Path, ns: str, pod: str) -> None:
    (tmp_path / ns).mkdir(parents=True, exist_ok=True)
    record = {"step": 30, "rank": 0, "host": pod, "pid": 1, "started": 0.0, "time": 3.0}
    (tmp_path / ns / "progress.jsonl").write_text(json.dumps(record) + "\n")


# Rank 0 on node-0 in both; the operator's store on node-1 beside a worker, the by-hand's store is its pod 0.
OPERATOR_PODS = {"train-worker-0": ("node-0", "u0"), "train-worker-1": ("node-1", "u1"),
                 "train-worker-2": ("node-2", "u2"), "train-rdzv": ("node-1", "us")}
BY_HAND_PODS = {"train-0": ("node-1", "u0"), "train-1": ("node-0", "u1"), "train-2": ("node-2", "u2")}


@pytest.mark.parametrize(("pods", "store", "rank0"), [
    (OPERATOR_PODS, "train-rdzv", "train-worker-0"), (BY_HAND_PODS, "train-0", "train-1")])
def test_a_sick_node_holds_neither_rank_0_nor_the_store_and_is_healed_by_its_undo(goodput, tmp_path, pods, store,
                                                                                   rank0):
    ns = "bench-goodput-x"
    rank0_on(tmp_path, ns, rank0)
    setup = FakeSetup(store, sorted(p for p in pods if p != "train-rdzv"))
    undo, why_not = goodput.inject("sick", setup, FakeApi(pods), ns)
    assert why_not is None
    assert sorted(p.name for p in (tmp_path / ns / "sick-nodes").iterdir()) == ["node-2"]
    undo()
    assert list((tmp_path / ns / "sick-nodes").iterdir()) == []
    assert goodput.HOLDS["sick"] < 120, "healed before the next fault at the default 2 minutes"


def test_without_a_node_free_of_both_the_spare_node_is_the_stores_not_rank_0s(goodput, tmp_path):
    rank0_on(tmp_path, "ns", "train-worker-0")
    pods = {"train-worker-0": ("node-0", "u0"), "train-worker-1": ("node-1", "u1"),
            "train-worker-2": ("node-0", "u2"), "train-rdzv": ("node-1", "us")}
    setup = FakeSetup("train-rdzv", ["train-worker-0", "train-worker-2", "train-worker-1"])
    assert goodput.spare_node(setup, FakeApi(pods), "ns") == "node-1"  # worker-2 is the first, on rank 0's node


@pytest.fixture
def throttles(goodput, monkeypatch) -> list[tuple[str, int | None]]:
    """The throttles asked for (the real one writes the pod's cgroups on a real node), one container each."""
    asked: list[tuple[str, int | None]] = []

    def throttle(ns: str, pod: str, percent: int | None) -> int:
        asked.append((pod, percent))
        return 1

    monkeypatch.setattr(goodput, "throttle", throttle)
    return asked


@pytest.mark.parametrize(("later", "lifted"), [
    ("same pod", True), ("gone", False), ("replaced under the same name", False)])
def test_a_slow_worker_is_a_spare_one_at_a_fifth_of_a_core_lifted_only_while_it_is_there(goodput, tmp_path,
                                                                                         throttles, later, lifted):
    ns = "bench-goodput-x"
    rank0_on(tmp_path, ns, "train-worker-0")
    pods = dict(OPERATOR_PODS)
    api = FakeApi(pods)
    setup = FakeSetup("train-rdzv", ["train-worker-0", "train-worker-1", "train-worker-2"])
    undo, why_not = goodput.inject("slow", setup, api, ns)
    assert why_not is None and throttles == [("train-worker-1", 20)]
    if later == "gone":
        del pods["train-worker-1"]
    elif later != "same pod":
        pods["train-worker-1"] = ("node-2", "another uid")
    undo()
    assert throttles[1:] == ([("train-worker-1", None)] if lifted else [])
    assert "slow" in goodput.HOLDS


def test_a_fault_that_cannot_be_made_is_skipped_with_its_reason(goodput, tmp_path, monkeypatch):
    ns = "bench-goodput-x"
    rank0_on(tmp_path, ns, "train-worker-0")
    setup = FakeSetup("train-rdzv", ["train-worker-0", "train-worker-1"])
    monkeypatch.setattr(goodput, "throttle", lambda ns, pod, percent: 0)
    assert goodput.inject("slow", setup, FakeApi(OPERATOR_PODS), ns) == (
        None, "train-worker-1 has no running container to throttle")
    assert goodput.inject("preemption", setup, FakeApi(OPERATOR_PODS), ns) == (None, "no Kueue")


def test_every_kind_can_be_made():
    import goodput

    assert set(goodput.FAULTS) == set(gm.KINDS)


def test_with_spares_the_faults_hit_only_the_workers_that_step(goodput, tmp_path):
    """A warm spare trains nothing: a fault there would cost nothing. A worker that stepped recently is hit."""
    import time as clock

    ns = "bench-goodput-s"
    (tmp_path / ns).mkdir(parents=True)
    now = clock.time()
    lines = [{"step": 30, "rank": 0, "host": "train-worker-0", "pid": 1, "started": 0.0, "time": now},
             {"step": 30, "rank": 1, "host": "train-worker-2", "pid": 1, "started": 0.0, "time": now},
             {"step": 2, "rank": 1, "host": "train-worker-1", "pid": 1, "started": 0.0, "time": now - 300}]
    (tmp_path / ns / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    setup = FakeSetup("train-rdzv", ["train-worker-0", "train-worker-1", "train-worker-2", "train-worker-3"])
    setup.spares = 1
    assert goodput.victim(setup, FakeApi(OPERATOR_PODS), ns) == "train-worker-2"
