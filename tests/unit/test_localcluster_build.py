"""build.sh's order, with a stand-in `go` on PATH (no Go build runs): CoreDNS and metrics-server build beside the
control plane, and a failure on either side stops the build with a line naming what failed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "localcluster" / "build.sh"
CONTROL_PLANE = {"kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "etcd", "kubelet",
                 "kube-proxy", "pause"}
MODULES = {"coredns", "metrics-server"}

# `go list -deps`, `go build -v -o DIR/ PKGS` and `go install -v PKG@VERSION`, each logging when it starts and ends,
# and gone at once on SIGTERM, as go is (its compiler processes write to go, not to go's output).
FAKE_GO = r"""#!/usr/bin/env bash
set -euo pipefail
nap() {
  sleep "$1" </dev/null >/dev/null 2>&1 &
  trap "kill $!; exit 143" TERM
  wait $!
}
verb=$1; shift
case $verb in
  list) for p in "$@"; do [[ $p == -* ]] || echo "$p"; done ;;
  build)
    out=; pkgs=()
    while (($#)); do
      case $1 in -o) out=$2; shift 2 ;; -ldflags) shift 2 ;; -*) shift ;; *) pkgs+=("$1"); shift ;; esac
    done
    echo "start build $(date +%s.%N)" >>"$FAKE_LOG"
    for p in "${pkgs[@]}"; do echo "$p"; done
    nap "${FAKE_BUILD_SECONDS:-1}"
    [[ ${FAKE_FAIL:-} == build ]] && { echo "compile error in the control plane" >&2; exit 1; }
    for p in "${pkgs[@]}"; do
      target=$out; [[ $out == */ ]] && target=$out${p##*/}
      touch "$target"; chmod +x "$target"
    done
    echo "end build $(date +%s.%N)" >>"$FAKE_LOG" ;;
  install)
    target=${!#}; name=${target%@*}; name=${name##*/}
    echo "start $name $(date +%s.%N)" >>"$FAKE_LOG"
    echo "$target/internal"
    nap "${FAKE_INSTALL_SECONDS:-1}"
    [[ ${FAKE_FAIL:-} == "$name" ]] && { echo "download of $name failed" >&2; exit 1; }
    touch "$GOBIN/$name"; chmod +x "$GOBIN/$name"
    echo "end $name $(date +%s.%N)" >>"$FAKE_LOG" ;;
  *) echo "fake go: $verb?" >&2; exit 2 ;;
esac
"""


def _build(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, float]]:
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "go").write_text(FAKE_GO)
    (fake / "go").chmod(0o755)
    log = tmp_path / "go.log"
    log.unlink(missing_ok=True)
    result = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "ELASTICJOB_CACHE": str(tmp_path / "cache"),
             "FAKE_LOG": str(log), **env})
    times = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        event, name, at = line.split()
        times[f"{event} {name}"] = float(at)
    return result, times


def test_coredns_and_metrics_server_build_beside_the_control_plane(tmp_path: Path) -> None:
    started = time.monotonic()
    result, times = _build(tmp_path, FAKE_BUILD_SECONDS="2", FAKE_INSTALL_SECONDS="2")
    assert result.returncode == 0, result.stderr
    bin_dir = Path(result.stdout.strip().splitlines()[-1])
    assert {p.name for p in bin_dir.iterdir()} == CONTROL_PLANE | MODULES
    assert not bin_dir.with_name("bin.partial").exists()
    for name in MODULES:
        assert times[f"start {name}"] < times["end build"]
        assert f"[build {name}] built in 0m0" in result.stderr
    assert time.monotonic() - started < 5  # one after the other would take 6 s
    again, _ = _build(tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == str(bin_dir) and not again.stderr


def test_a_missing_module_binary_is_built_alone(tmp_path: Path) -> None:
    first, _ = _build(tmp_path, FAKE_BUILD_SECONDS="0", FAKE_INSTALL_SECONDS="0")
    bin_dir = Path(first.stdout.strip().splitlines()[-1])
    (bin_dir / "coredns").unlink()
    result, times = _build(tmp_path, FAKE_INSTALL_SECONDS="0")
    assert result.returncode == 0, result.stderr
    assert set(times) == {"start coredns", "end coredns"}
    assert (bin_dir / "coredns").exists()


@pytest.mark.parametrize("failing", ["coredns", "metrics-server"])
def test_a_failed_module_build_names_itself_and_installs_nothing(tmp_path: Path, failing: str) -> None:
    result, _ = _build(tmp_path, FAKE_FAIL=failing, FAKE_BUILD_SECONDS="0", FAKE_INSTALL_SECONDS="0")
    assert result.returncode != 0
    assert f"download of {failing} failed" in result.stderr
    assert f"[build {failing}] go install" in result.stderr and "failed (exit 1)" in result.stderr
    assert not list((tmp_path / "cache").glob("localcluster-*/bin"))


def test_a_failed_control_plane_build_stops_the_module_builds(tmp_path: Path) -> None:
    started = time.monotonic()
    result, times = _build(tmp_path, FAKE_FAIL="build", FAKE_BUILD_SECONDS="0", FAKE_INSTALL_SECONDS="30")
    assert result.returncode != 0
    assert "compile error in the control plane" in result.stderr
    assert time.monotonic() - started < 10  # not held up by the 30 s installs: they were stopped
    assert "start coredns" in times and "end coredns" not in times
    assert not list((tmp_path / "cache").glob("localcluster-*/bin"))
