"""build.sh's order, with a stand-in `go` on PATH (no Go build runs): CoreDNS and metrics-server build beside the
control plane, and a failure on either side stops the build with a line naming what failed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import wait_for

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
      case $1 in -o) out=$2; shift 2 ;; -ldflags) echo "ldflags $2" >>"$FAKE_LOG.seen"; shift 2 ;;
        -*) shift ;; *) pkgs+=("$1"); shift ;; esac
    done
    echo "build in $PWD" >>"$FAKE_LOG.seen"
    echo "start build $(date +%s.%N)" >>"$FAKE_LOG"
    for p in "${pkgs[@]}"; do echo "$p"; done
    nap "${FAKE_BUILD_SECONDS:-1}"
    [[ ${FAKE_FAIL:-} == build ]] && { echo "compile error in the control plane" >&2; exit 1; }
    for p in "${pkgs[@]}"; do
      target=$out; [[ $out == */ ]] && target=$out${p##*/}
      touch "$target"; chmod +x "$target"
    done
    echo "end build $(date +%s.%N)" >>"$FAKE_LOG" ;;
  mod)
    case $1 in
      download) printf '{\n\t"Path": "k8s.io/kubernetes",\n\t"GoMod": "%s",\n\t"Sum": "h1:x="\n}\n' "$FAKE_UPSTREAM" ;;
      tidy) echo "tidy $PWD" >>"$FAKE_LOG.seen"; touch go.sum ;;
    esac ;;
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


PINNED = next(line.split()[1] for line in (ROOT / "localcluster" / "go.mod").read_text().splitlines()
              if line.strip().startswith("k8s.io/kubernetes v"))
# The release's own go.mod, as the module proxy serves it: its etcd and its staging modules, not ours.
UPSTREAM_GOMOD = """module k8s.io/kubernetes

go 1.24.0

godebug default=go1.24

require (
	go.etcd.io/etcd/client/v3 v3.5.21
	go.etcd.io/etcd/server/v3 v3.5.21 // indirect
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	k8s.io/only-in-this-release => ./staging/src/k8s.io/only-in-this-release
)
"""


def _bin_dir(version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD), "--bin-dir"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "ELASTICJOB_CACHE": "/cache", "ELASTICJOB_K8S_VERSION": version})


@pytest.mark.parametrize("asked, built", [
    ("", PINNED),  # unset: the pinned release, what `make test` uses
    ("1.33", "v1.33.13"),  # a minor: its newest patch in the table
    ("v1.33", "v1.33.13"),
    ("1.33.5", "v1.33.5"),  # a full version: itself
    ("1.34", "v1.34.4"), ("1.35", "v1.35.4"), ("1.37", "v1.37.2"),
    (PINNED[1:].rsplit(".", 1)[0], PINNED),  # the pinned minor is the pinned release
])
def test_the_asked_release_picks_its_bin_dir(asked: str, built: str) -> None:
    result = _bin_dir(asked)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"/cache/localcluster-{built}/bin"


@pytest.mark.parametrize("asked", ["1.32", "1.38", "1.32.4", "2.0", "latest", "1.33.x"])
def test_a_release_outside_the_supported_minors_is_refused(asked: str) -> None:
    result = _bin_dir(asked)
    assert result.returncode == 2 and not result.stdout
    assert f"Kubernetes {asked} is not supported" in result.stderr and "1.33 1.34 1.35 1.36 1.37" in result.stderr


def test_another_release_builds_from_a_module_of_its_own(tmp_path: Path) -> None:
    upstream = tmp_path / "v1.33.13.mod"
    upstream.write_text(UPSTREAM_GOMOD)
    result, _ = _build(tmp_path, ELASTICJOB_K8S_VERSION="1.33", FAKE_UPSTREAM=str(upstream),
                       FAKE_BUILD_SECONDS="0", FAKE_INSTALL_SECONDS="0")
    assert result.returncode == 0, result.stderr
    release = tmp_path / "cache" / "localcluster-v1.33.13"
    assert result.stdout.strip() == str(release / "bin")
    assert {p.name for p in (release / "bin").iterdir()} == CONTROL_PLANE | MODULES
    module = release / "module"
    gomod = module / "go.mod"
    requires = [line.split() for line in gomod.read_text().splitlines() if line.startswith("\t") and "=>" not in line]
    assert requires == [["go.etcd.io/etcd/server/v3", "v3.5.21"], ["k8s.io/kubernetes", "v1.33.13"]]
    replaces = [line.split() for line in gomod.read_text().splitlines() if "=>" in line]
    assert replaces == [[m, "=>", m, "v0.33.13"] for m in ("k8s.io/api", "k8s.io/client-go", "k8s.io/only-in-this-release")]
    assert "godebug default=go1.24" in gomod.read_text()
    for copied in ("cmd/etcd/main.go", "cmd/pause/main.go", "tools.go"):
        assert (module / copied).read_text() == (ROOT / "localcluster" / copied).read_text()
    seen = (tmp_path / "go.log.seen").read_text().splitlines()
    assert f"tidy {module}.partial" in seen and f"build in {module}" in seen
    assert any("gitVersion=v1.33.13" in line and "gitMinor=33 " in line for line in seen if line.startswith("ldflags"))
    assert not module.with_name("module.partial").exists()


def test_the_pinned_release_builds_from_this_directory(tmp_path: Path) -> None:
    result, _ = _build(tmp_path, FAKE_BUILD_SECONDS="0", FAKE_INSTALL_SECONDS="0")
    assert result.returncode == 0, result.stderr
    assert f"build in {ROOT / 'localcluster'}" in (tmp_path / "go.log.seen").read_text().splitlines()
    assert not (tmp_path / "cache" / f"localcluster-{PINNED}" / "module").exists()


def test_a_running_cluster_of_another_release_is_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localcluster.controlplane import running_another_release
    from localcluster.layout import Layout

    root = tmp_path / "root"
    root.mkdir()
    (root / "localcluster").symlink_to(ROOT / "localcluster")
    layout = Layout(root)
    monkeypatch.setenv("ELASTICJOB_CACHE", str(tmp_path / "cache"))
    # An "API server" of the pinned release: a sleep by that name, its pid where `up` records it.
    program = tmp_path / "cache" / f"localcluster-{PINNED}" / "bin" / "kube-apiserver"
    program.parent.mkdir(parents=True)
    program.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(program), "60"])
    try:
        # Until it has exec'd, /proc shows the forking Python's command line.
        wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 10, "the stand-in API server started",
                 until=lambda line: str(program).encode() in line)
        layout.pids.mkdir(parents=True)
        layout.pid_file("apiserver").write_text(f"{proc.pid}\n")
        monkeypatch.setenv("ELASTICJOB_K8S_VERSION", "")
        assert running_another_release(layout) is None
        monkeypatch.setenv("ELASTICJOB_K8S_VERSION", "1.33")
        assert running_another_release(layout) == program
    finally:
        proc.kill()
        proc.wait()
