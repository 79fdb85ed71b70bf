"""The soak's checker sees each kind of violation it is there for (fed by hand, no cluster)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soak"))

from invariants import JobHistory, Objects, Violations, steady  # noqa: E402


def job(rv: int, restarts: int = 0, infra: int = 0, failures=(), uid: str = "u1", phase: str = "Running") -> dict:
    return {"metadata": {"name": "alpha", "uid": uid, "resourceVersion": str(rv)},
            "spec": {"replicas": 2}, "status": {"phase": phase, "restarts": restarts, "infrastructureFailures": infra,
                                                "readyReplicas": 2, "lastFailures": [{"uid": f} for f in failures]}}


def history() -> tuple[JobHistory, Violations]:
    violations = Violations()
    return JobHistory(None, "ns", violations), violations  # never started: fed by hand


def test_a_counter_going_down_is_a_violation():
    h, v = history()
    h.observe("MODIFIED", job(1, restarts=2))
    h.observe("MODIFIED", job(2, restarts=1))
    assert v.count("counter-went-down") == 1


def test_a_failure_dropped_and_recorded_again_is_counted_twice():
    h, v = history()
    h.observe("MODIFIED", job(1, failures=["a", "b"]))
    h.observe("MODIFIED", job(2, failures=["b", "c"]))   # "a" rolled out of the display list
    assert v.count("counted-twice") == 0
    h.observe("MODIFIED", job(3, failures=["c", "a"]))   # and came back: counted again
    assert v.count("counted-twice") == 1


def test_a_relist_drops_jobs_deleted_in_a_gap():
    h, _ = history()
    h.observe("ADDED", job(1, uid="gone"))
    h.replace([job(2, uid="here")])
    assert set(h.latest) == {"here"}


def pod(name, owner, index, phase="Running", deleting=False, role="worker"):
    meta = SimpleNamespace(name=name, uid=name + "-uid", deletion_timestamp="now" if deleting else None,
                           labels={"elasticjob.dev/replica-index": str(index), "elasticjob.dev/role": role},
                           owner_references=[SimpleNamespace(uid=owner, controller=True)])
    return SimpleNamespace(metadata=meta, status=SimpleNamespace(phase=phase), kind="Pod")


def objects() -> tuple[Objects, Violations]:
    v = Violations()
    return Objects(None, "ns", Path("/nonexistent"), v), v


def test_two_live_pods_for_one_index_are_a_violation_but_one_leaving_is_not():
    o, v = objects()
    o._two_live([pod("a-worker-0", "u1", 0), pod("a-worker-0b", "u1", 0, deleting=True)])
    assert v.count("two-live-pods") == 0
    o._two_live([pod("a-worker-0", "u1", 0), pod("x", "u1", 0)])
    assert v.count("two-live-pods") == 1


def test_succeeded_with_a_running_worker_is_a_violation():
    o, v = objects()
    o._succeeded_while_running([pod("a-worker-0", "u1", 0)], {"u1": job(1, phase="Succeeded")})
    assert v.count("succeeded-while-running") == 1


def test_an_object_whose_owner_is_gone_past_the_delay_is_an_orphan(monkeypatch):
    import invariants

    o, v = objects()
    clock = iter([0.0, 100.0])
    monkeypatch.setattr(invariants.time, "monotonic", lambda: next(clock))
    o._orphans([pod("a-worker-0", "gone", 0)], {})
    o._orphans([pod("a-worker-0", "gone", 0)], {})
    assert v.count("orphan") == 1


def test_steady_means_final_suspended_or_every_desired_worker_ready():
    assert steady(job(1), []) and steady(job(1, phase="Succeeded"), [])
    waiting = job(1)
    waiting["status"]["readyReplicas"] = 1
    assert not steady(waiting, [])


def test_a_force_deleted_pods_processes_beside_its_replacement_are_tolerated_briefly(monkeypatch):
    """10 s after the force delete; 90 s after an API server restart, across which a kubelet's watch stayed broken
    and the old containers ran on for 65 s (CI, seed 549492). Past both, a violation."""
    import invariants

    o, v = objects()
    # The nodes run processes of two uids that the API listed under one pod name.
    monkeypatch.setattr(o, "_nodes", SimpleNamespace(live_pod_uids=lambda: {"old", "new", "unlisted"}))
    o._names.update(old="a-worker-0", new="a-worker-0")
    now = iter([100.0, 130.0, 300.0])
    monkeypatch.setattr(invariants.time, "monotonic", lambda: next(now))
    o.force_deleted["a-worker-0"] = 95.0
    o._live_processes()  # 5 s after the force delete
    assert v.count("two-live-pods") == 0 and len(o.tolerated) == 1
    o.api_restarted_at = 80.0
    o._live_processes()  # 35 s after the force delete, 50 s after the API server's restart
    assert v.count("two-live-pods") == 0
    o._live_processes()  # long past both
    assert v.count("two-live-pods") == 1
