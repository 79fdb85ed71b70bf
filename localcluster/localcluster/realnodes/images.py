"""The images a real node runs, put into its containerd: no registry can be reached here.

The cluster's own parts (the pause sandbox, CoreDNS) are one static Go binary each, made into an image `FROM
scratch` with buildah; the project's images come from imagebuild (images/*.Dockerfile), which `up` starts beside
the Go build (ProjectImages). Each node imports every tarball with `ctr images import`, once per tarball (a marker
names the tarballs a node has); the nodes import at the same time, each into its own containerd.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from localcluster.imagebuild import build as imagebuild
from localcluster.imagebuild import plan as imageplan
from localcluster.realnodes.plan import RealNode

Log = Callable[[str], None]


def imagebuild_argv(cache: Path) -> list[str]:
    return [sys.executable, "-m", "localcluster.imagebuild", "--cache-dir", str(cache)]


class ProjectImages:
    """The image builder (`argv`, imagebuild_argv) running from construction until `tarballs()`: it needs nothing
    the Go build makes, and much of it waits on the network (mmdebstrap, pip) and the disk, at nice 10, while the
    Go build keeps both cores busy. Its progress lines go to stderr as they come.

    As a context manager it never outlives the block: leaving it on an error interrupts a build still running as
    Ctrl-C would (the builder and its current step get SIGINT, and the builder removes its scratch storage)."""

    def __init__(self, argv: list[str], cwd: Path, log: Log) -> None:
        log("  images from images/*.Dockerfile (buildah; cached when nothing changed), in the background")
        self._proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, errors="replace")
        # Relayed rather than inherited so that a failure's last line can be repeated in the error: minutes of Go
        # build progress may lie between that line and the error.
        self._last = ""
        self._relay = threading.Thread(target=self._relay_stderr, name="imagebuild-stderr", daemon=True)
        self._relay.start()

    def _relay_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            self._last = line.strip() or self._last

    def _wait(self) -> str:
        assert self._proc.stdout is not None
        out = self._proc.stdout.read()
        self._proc.wait()
        self._relay.join()
        return out

    def tarballs(self) -> list[Path]:
        out = self._wait()
        if self._proc.returncode != 0:
            raise RuntimeError(f"the images could not be built (exit {self._proc.returncode}): {self._last}")
        return [Path(line) for line in out.splitlines() if line.endswith(".tar")]

    def __enter__(self) -> ProjectImages:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        # After a Ctrl-C the builder, in our process group, has had its SIGINT already: it only needs waiting for.
        if self._proc.poll() is None and kind is not KeyboardInterrupt:
            _interrupt_tree(self._proc.pid)
        self._wait()


def _interrupt_tree(pid: int) -> None:
    """SIGINT to a process and every process under it, as a Ctrl-C on the terminal sends it to them all."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            stat = (entry / "stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
    todo = [pid]
    while todo:
        each = todo.pop()
        todo.extend(children.get(each, []))
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGINT)


def binary_image(cache: Path, binary: Path, ref: str, log: Log) -> Path:
    """A docker-archive tarball of `ref`: the binary at /<name>, its entrypoint; cached by the binary's digest."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    name = ref.rsplit("/", 1)[-1].replace(":", "-")
    tarball = cache / f"{name}-{digest}.tar"
    if tarball.exists():
        return tarball
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    storage = cache / f".storage-{time.time_ns()}"
    partial = tarball.with_suffix(".partial")
    try:
        def buildah(*argv: str) -> str:
            result = subprocess.run(imageplan.buildah(storage, *argv), capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"buildah {argv[0]} for {ref} failed: {result.stderr.strip()[-500:]}")
            return result.stdout.strip()

        container = buildah("from", "scratch")
        buildah("copy", container, str(binary), f"/{binary.name}")
        buildah("config", "--entrypoint", f'["/{binary.name}"]', container)
        buildah("commit", "--quiet", "--rm", container, f"localhost/{ref}")
        buildah("push", "--quiet", f"localhost/{ref}", f"docker-archive:{partial}:{ref}")
        partial.rename(tarball)
    finally:
        partial.unlink(missing_ok=True)
        imagebuild.remove_storage(storage)
    log(f"  image {ref} from {binary.name} ({time.monotonic() - started:.1f}s)")
    return tarball


def imported(node: RealNode) -> set[str]:
    marker = node.path("imported")
    return set(marker.read_text().split()) if marker.exists() else set()


def import_everywhere(nodes: list[RealNode], tarballs: list[Path], log: Log) -> None:
    """Every node imports what it lacks, all at once: each has its own containerd (own socket, content store and
    snapshots), so they share only the cores and the disk, and one import hashes while another waits on its
    writes. Returns once every import has ended; raises the first node's error."""
    lock = threading.Lock()

    def whole_lines(line: str) -> None:
        with lock:
            log(line)

    with ThreadPoolExecutor(max_workers=max(len(nodes), 1), thread_name_prefix="import") as pool:
        for done in [pool.submit(import_all, each, tarballs, whole_lines) for each in nodes]:
            done.result()


def import_all(node: RealNode, tarballs: list[Path], log: Log) -> None:
    """Imports what the node's containerd does not have yet (its content store survives restarts)."""
    have = imported(node)
    # One tarball at a time within a node: the operator and worker tarballs carry the same base layer, which the
    # second import then finds already there.
    for tarball in tarballs:
        if tarball.name in have:
            continue
        started = time.monotonic()
        result = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "images", "import",
                                 str(tarball)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{node.name}: ctr images import {tarball.name} failed: {result.stderr.strip()}")
        have.add(tarball.name)
        node.path("imported").write_text("\n".join(sorted(have)) + "\n")
        log(f"  {node.name}: imported {tarball.name} ({time.monotonic() - started:.1f}s)")


def pull_everywhere(nodes: list[RealNode], refs: list[str], credentials: str, log: Log) -> None:
    """Every node's containerd pulls the project's images from the registry (its hosts.toml and CA, the
    registry's credentials), all nodes at once, as a pre-pull DaemonSet warms a real cluster's nodes: the first
    job's pods then start in seconds, not after three nodes unpacked 1.1 GB each while the test's clock runs. A
    pod still pulls through its own imagePullSecrets (its reference is resolved against the registry again)."""
    def pull(node: RealNode) -> None:
        for ref in refs:
            started = time.monotonic()
            result = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "images", "pull",
                                     "--hosts-dir", str(node.path("certs.d")), "--user", credentials, ref],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{node.name}: ctr images pull {ref} failed: {result.stderr.strip()[-500:]}")
            log(f"  {node.name}: pulled {ref} ({time.monotonic() - started:.1f}s)")

    with ThreadPoolExecutor(max_workers=max(len(nodes), 1), thread_name_prefix="pull") as pool:
        for done in [pool.submit(pull, each) for each in nodes]:
            done.result()
