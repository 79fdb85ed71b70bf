"""The real nodes' images without a cluster: the image build in the background (a stand-in builder), the nodes'
imports at the same time (a stand-in `ctr` on PATH; no containerd runs), and buildah's scratch storage removed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from localcluster.imagebuild import build as imagebuild
from localcluster.realnodes import images
from localcluster.realnodes.plan import RealNode


def _builder(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


def test_the_build_runs_in_the_background_and_hands_over_its_tarballs(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    started = time.monotonic()
    argv = _builder("""
        import sys, time
        print("[imagebuild] building elasticjob-worker:cpu", file=sys.stderr, flush=True)
        time.sleep(1)
        print("/cache/elasticjob-operator-dev-1.tar")
        print("/cache/elasticjob-worker-cpu-2.tar")
    """)
    with images.ProjectImages(argv, tmp_path, lines.append) as building:
        assert time.monotonic() - started < 0.8  # not waited for here
        tarballs = building.tarballs()
    assert tarballs == [Path("/cache/elasticjob-operator-dev-1.tar"), Path("/cache/elasticjob-worker-cpu-2.tar")]
    assert "[imagebuild] building elasticjob-worker:cpu\n" in capsys.readouterr().err
    assert lines and "in the background" in lines[0]


def test_a_failed_build_repeats_its_last_line_in_the_error(tmp_path: Path) -> None:
    argv = _builder("""
        import sys
        print("[imagebuild] starting", file=sys.stderr)
        print("imagebuild: no torch wheel torch-2.13.0+cpu-cp311-cp311-*.whl in /shared/wheels", file=sys.stderr)
        print(file=sys.stderr)
        sys.exit(2)
    """)
    with pytest.raises(RuntimeError) as raised, images.ProjectImages(argv, tmp_path, print) as building:
        building.tarballs()
    assert str(raised.value) == ("the images could not be built (exit 2): imagebuild: no torch wheel "
                                 "torch-2.13.0+cpu-cp311-cp311-*.whl in /shared/wheels")


# A builder in the middle of a step that runs a command of its own, each writing down the SIGINT it gets.
CHAIN = """
import pathlib, signal, subprocess, sys, time
out, depth, me = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
child = subprocess.Popen([sys.executable, "-c", me, str(out), str(depth - 1), me]) if depth else None
def stop(*_):
    if child:
        child.wait()
    (out / f"interrupted-{depth}").touch()
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
(out / f"ready-{depth}").touch()
time.sleep(30)
"""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_an_error_beside_the_build_interrupts_it_and_its_steps_as_ctrl_c_would(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="go build failed"), \
            images.ProjectImages([sys.executable, "-c", CHAIN, str(tmp_path), "2", CHAIN], tmp_path, print):
        for depth in range(3):
            _wait_for(tmp_path / f"ready-{depth}")
        raise RuntimeError("go build failed")
    assert {p.name for p in tmp_path.glob("interrupted-*")} == {"interrupted-0", "interrupted-1", "interrupted-2"}
    assert time.monotonic() - started < 10


def test_after_a_ctrl_c_the_build_is_only_waited_for(tmp_path: Path) -> None:
    argv = _builder("""
        import pathlib, signal, sys, time
        signal.signal(signal.SIGINT, lambda *_: pathlib.Path(sys.argv[1], "signalled").touch())
        time.sleep(0.5)
        pathlib.Path(sys.argv[1], "finished").touch()
    """)
    with pytest.raises(KeyboardInterrupt), images.ProjectImages([*argv, str(tmp_path)], tmp_path, print):
        raise KeyboardInterrupt
    assert (tmp_path / "finished").exists()
    assert not (tmp_path / "signalled").exists()


FAKE_CTR = """#!/usr/bin/env bash
# ctr --address SOCKET --namespace k8s.io images import TARBALL
socket=$2 tarball=${!#}
echo "start $socket ${tarball##*/} $(date +%s.%N)" >>"$CTR_LOG"
sleep 0.5
[[ $socket == *"$CTR_FAIL"* && -n $CTR_FAIL ]] && { echo "ctr: failed to import" >&2; exit 1; }
echo "end $socket ${tarball##*/} $(date +%s.%N)" >>"$CTR_LOG"
"""


@pytest.fixture()
def fake_ctr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ctr").write_text(FAKE_CTR)
    (bin_dir / "ctr").chmod(0o755)
    log = tmp_path / "ctr.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("CTR_LOG", str(log))
    return log


def _nodes(state: Path) -> list[RealNode]:
    nodes = [RealNode(i, f"local-node-{i}", state) for i in range(3)]
    for node in nodes:
        node.dir.mkdir(parents=True)
    return nodes


def _events(log: Path) -> list[tuple[str, str, str, float]]:
    return [(kind, Path(socket).parts[-3], tarball, float(at))
            for kind, socket, tarball, at in (line.split() for line in log.read_text().splitlines())]


def test_the_nodes_import_at_the_same_time_each_tarball_once(tmp_path: Path, fake_ctr: Path) -> None:
    nodes = _nodes(tmp_path / "state")
    tarballs = [tmp_path / "pause-1-a.tar", tmp_path / "elasticjob-worker-cpu-b.tar"]
    images.import_all(nodes[2], tarballs[:1], print)  # node 2 has pause from an earlier run
    fake_ctr.unlink()
    lines: list[str] = []
    started = time.monotonic()
    images.import_everywhere(nodes, tarballs, lines.append)
    assert time.monotonic() - started < 2.5  # five imports of 0.5 s, one after the other, would take 2.5 s
    events = _events(fake_ctr)
    assert sorted((node, tarball) for kind, node, tarball, _ in events if kind == "end") == [
        ("local-node-0", "elasticjob-worker-cpu-b.tar"), ("local-node-0", "pause-1-a.tar"),
        ("local-node-1", "elasticjob-worker-cpu-b.tar"), ("local-node-1", "pause-1-a.tar"),
        ("local-node-2", "elasticjob-worker-cpu-b.tar")]
    for node in nodes:
        assert images.imported(node) == {"pause-1-a.tar", "elasticjob-worker-cpu-b.tar"}
        mine = [event for event in events if event[1] == node.name]
        assert all(end[3] <= start[3] for end, start in zip(mine[1::2], mine[2::2], strict=False))  # one at a time
    assert sorted(line.split(":")[0] for line in lines) == ["  local-node-0", "  local-node-0", "  local-node-1",
                                                            "  local-node-1", "  local-node-2"]


def test_a_failed_import_names_its_node_once_every_import_has_ended(tmp_path: Path, fake_ctr: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTR_FAIL", "local-node-0/")
    nodes = _nodes(tmp_path / "state")
    before = set(threading.enumerate())  # other tests' daemon threads (a progress reporter, a persister) may live on
    with pytest.raises(RuntimeError, match="local-node-0: ctr images import pause-1-a.tar failed: ctr: failed"):
        images.import_everywhere(nodes, [tmp_path / "pause-1-a.tar"], print)
    assert set(threading.enumerate()) <= before
    assert images.imported(nodes[1]) == images.imported(nodes[2]) == {"pause-1-a.tar"}
    assert images.imported(nodes[0]) == set()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root)")
def test_scratch_storage_goes_with_what_is_still_mounted_in_it(tmp_path: Path) -> None:
    """As an overlay container's root filesystem stays mounted when buildah is killed mid-step."""
    storage = tmp_path / ".storage-1"
    merged = storage / "root" / "overlay" / "abc" / "merged"
    merged.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(merged)], check=True)
    try:
        (merged / "file").write_text("in the container")
        imagebuild.remove_storage(storage)
        assert not storage.exists()
    finally:
        subprocess.run(["umount", "-l", str(merged)], capture_output=True, check=False)
    assert str(merged) not in Path("/proc/self/mountinfo").read_text()
