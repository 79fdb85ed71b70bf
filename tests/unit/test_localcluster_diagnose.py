"""What a failed `make run` names: pods that cannot start, each with why."""

from __future__ import annotations

from localcluster.diagnose import last_line, problems


def pod(name: str, **status) -> dict:
    return {"metadata": {"namespace": "ns", "name": name}, "status": status}


def test_crash_looping_restarted_and_unschedulable_pods_are_named():
    pods = [
        pod("looping", containerStatuses=[{"name": "op", "restartCount": 4,
                                           "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                                           "lastState": {"terminated": {"exitCode": 1}}}]),
        pod("restarted", containerStatuses=[{"name": "op", "restartCount": 2, "state": {"running": {}},
                                             "lastState": {"terminated": {"exitCode": 128}}}]),
        pod("pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/3 nodes are available: 3 Insufficient cpu."}]),
        pod("healthy", containerStatuses=[{"name": "w", "restartCount": 0, "state": {"running": {}}}]),
        pod("restarted-cleanly", containerStatuses=[{"name": "w", "restartCount": 1, "state": {"running": {}},
                                                     "lastState": {"terminated": {"exitCode": 0}}}]),
    ]
    assert problems(pods) == [
        ("ns/looping", "container op: CrashLoopBackOff back-off", "op"),
        ("ns/restarted", "container op restarted 2 times, last exit code 128", "op"),
        ("ns/pending", "unschedulable: 0/3 nodes are available: 3 Insufficient cpu.", None),
    ]


def test_last_line_skips_blank_lines():
    assert last_line("first\nmount x on /etc/y: No such file or directory\n\n") == \
        "mount x on /etc/y: No such file or directory"
    assert last_line("") == ""
