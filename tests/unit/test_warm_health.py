"""The agent's readiness endpoint (elasticjob_warm/health.py): GET /healthz answers from the agent's rendezvous
store, 503 only when this pod is cut off from it (or not in the round yet). The endpoint and its rule on a
fake clock and an injected connect; the connect itself against real sockets; then real torchrun agents
(`python -m elasticjob_warm.torchrun`) on a real TCPStore that is stopped and killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from elasticjob_warm import health
from helpers import wait_for
from store_process import free_port_pair

STORE = textwrap.dedent("""
    import sys, time, torch.distributed as d
    s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False, multi_tenant=True)
    print('up', flush=True)
    time.sleep(3600)
""")
WORKER = textwrap.dedent("""
    import json, os, sys, time
    out = sys.argv[1]
    json.dump({"parent": os.getppid()}, open(os.path.join(out, "worker"), "w"))
    while not os.path.exists(os.path.join(out, "stop")):
        time.sleep(0.05)
    sys.exit(int(sys.argv[2]))
""")
# Before the wrapper's main: torch's package metadata names a version outside the range (plain torchrun).
OTHER_VERSION = textwrap.dedent("""
    import importlib.metadata as metadata
    real = metadata.version
    metadata.version = lambda name: "2.99.0" if name == "torch" else real(name)
""")


def get(port: int, path: str = health.PATH) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Probe:
    """An injected connect: answers `verdict`, counts its calls."""

    def __init__(self, verdict: str) -> None:
        self.verdict, self.calls = verdict, []

    def __call__(self, host: str, port: int) -> str:
        self.calls.append((host, port))
        return self.verdict


@pytest.fixture
def served():
    """A Health on a fake clock, served on a free port: (health, port, clock, probe)."""
    clock, probe = Clock(), Probe("answers")
    state = health.Health(("10.96.0.7", 29400), probe=probe, clock=clock)
    port = free_port_pair()
    server = health.serve(state, port)
    yield state, port, clock, probe
    server.shutdown()
    server.server_close()


def test_the_endpoint_is_unready_until_the_store_first_answered_then_ready(served, capfd):
    state, port, clock, _ = served
    assert get(port) == (503, "not in the rendezvous yet\n")
    state.answered()
    assert get(port) == (200, "ok\n")
    clock.now += health.FLOOR
    assert get(port) == (200, "ok\n")
    assert get(port, "/metrics")[0] == 404
    assert get(port, "/healthz?verbose=1") == (200, "ok\n")
    assert capfd.readouterr().err == ""  # no line per probe in the pod's log


@pytest.mark.parametrize("verdict, code, says", [
    ("silent", 503, "no answer from the rendezvous store at 10.96.0.7:29400 for 3 s: this pod is cut off"),
    ("refused", 200, "ok: the rendezvous store at 10.96.0.7:29400 is gone for every agent (connection refused)"),
    ("answers", 200, "ok: the rendezvous store at 10.96.0.7:29400 accepts connections but has not answered for 3 s"),
])
def test_a_store_quiet_past_the_limit_makes_the_pod_unready_only_when_nothing_answers_its_connect(
        served, verdict, code, says):
    state, port, clock, probe = served
    probe.verdict = verdict
    state.answered()
    clock.now += health.FLOOR + 1
    assert get(port) == (code, says + "\n")
    state.answered()  # the store answers again: ready, whatever the last connect said
    assert get(port) == (200, "ok\n")


def test_the_connect_is_tried_only_once_the_answers_are_stale_and_at_most_once_a_second(served):
    state, port, clock, probe = served
    state.limit = 6.0
    state.answered()
    for _ in range(6):  # the steady state: no connection to the store from the probe
        clock.now += 1
        assert get(port)[0] == 200
    assert probe.calls == []
    clock.now += 0.5
    for _ in range(3):  # probes within the second: one connect
        assert get(port)[0] == 200
        clock.now += 0.25
    assert probe.calls == [("10.96.0.7", 29400)]
    clock.now += 0.25  # a second after the connect
    get(port)
    assert len(probe.calls) == 2


def test_a_standalone_agent_is_ready_while_its_own_store_is_quiet():
    clock = Clock()
    state = health.Health(None, probe=Probe("silent"), clock=clock)
    state.answered()
    clock.now += 60
    assert state.status() == (True, "ok")


@pytest.mark.parametrize("conf, limit", [
    ("is_host=false,keep_alive_interval=1,read_timeout=30", 2.0),
    ("keep_alive_interval=0.5", 2.0),
    ("keep_alive_interval=2", 4.0),
    ("is_host=false", 10.0),  # torch's own 5 s keep-alive
    (None, 10.0),
    ("keep_alive_interval=x", 10.0),
])
def test_the_limit_is_two_keep_alives_and_never_under_two_seconds(conf, limit):
    assert health.limit(conf) == limit


def test_the_connect_tells_a_refused_a_listening_and_a_silent_address_apart():
    port = free_port_pair()
    assert health.connect("127.0.0.1", port) == "refused"  # nothing listens there
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen(0)  # an accept queue of one, never accepted from
        assert health.connect("127.0.0.1", port) == "answers"  # the kernel completed it: it fills the queue
        # A full queue: the kernel drops the SYN, as a cut-off network does.
        assert health.connect("127.0.0.1", port, timeout=0.2) == "silent"


@pytest.fixture
def master():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=10))
    yield store


class GoneStore:
    """A store client whose server is gone, as a TCPStore's operations then fail."""

    def get(self, key):
        raise RuntimeError("Broken pipe")

    compare_set = get


def test_every_read_and_write_of_torchs_backend_counts_as_the_stores_answer(master):
    state = health.Health(("127.0.0.1", master.port))
    undo = health.watch(state, "keep_alive_interval=2")
    try:
        assert state.limit == 4.0
        backend = c10d.C10dRendezvousBackend(master, "health")
        assert state.last is None  # the constructor seeds the key: no answer counted, nothing read yet
        backend.get_state()
        first = state.last
        assert first is not None
        backend.set_state(b"state")
        assert state.last > first
        # outage.py hands the handler a backend of the same class on a new store: its answers count too
        state.last = None
        type(backend)(master, "health").get_state()
        assert state.last is not None
        # A failed operation is no answer
        state.last = None
        backend._store = GoneStore()
        with pytest.raises(RendezvousConnectionError):
            backend.get_state()
        assert state.last is None and not state.always
    finally:
        undo()
    state.last = None
    c10d.C10dRendezvousBackend(master, "health").get_state()
    assert state.last is None


def test_a_torch_whose_backend_is_not_the_known_one_leaves_the_pod_ready(monkeypatch):
    monkeypatch.setattr(c10d, "C10dRendezvousBackend", type("Other", (), {}))
    state = health.Health(("127.0.0.1", 1), probe=Probe("silent"))
    assert health.watch(state, None) is None
    assert state.always and state.status() == (True, "ok")  # before any answer too


def test_no_port_no_endpoint_and_a_taken_port_is_said_once(capfd):
    assert health.start("127.0.0.1:29400", {}) is None
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert health.start("127.0.0.1:29400", {health.PORT_ENV: str(port)}) is None
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"no health endpoint on {health.PORT_ENV}={port}" in err, err


# ---------------------------------------------------------------- real agents


def start_store(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", STORE, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout.readline().strip() == b"up"
    return proc


def agent(tmp_path, health_port: int, *argv: str, **env_extra: str) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"), ELASTICJOB_WARM_PRELOAD="decimal",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **{health.PORT_ENV: str(health_port)}, **env_extra)
    with open(tmp_path / "log", "w") as log:  # the server keeps the agent's stderr: a pipe would not end
        return subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--max-restarts=0",
                                 "--nproc-per-node=1", *argv, str(script), str(tmp_path), "3"],
                                env=env, stdout=log, stderr=log, start_new_session=True)


def answers(port: int, seen: list[tuple[int, str]]) -> tuple[int, str]:
    found = get(port)
    seen.append(found)
    return found


def test_a_real_agent_is_ready_once_in_its_round_and_stays_ready_while_its_store_is_stopped_or_gone(tmp_path):
    """Readiness follows the agent's own store operations: none before the store is up (503), ready once it
    joined, and ready while a store it reaches stops answering (SIGSTOP: its kernel still completes the connect)
    and once it is gone (SIGKILL: refused), both losses every agent shares."""
    store_port, health_port = free_port_pair(), free_port_pair()
    proc = agent(tmp_path, health_port, "--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{store_port}",
                 "--rdzv-id=health", "--rdzv-conf=is_host=false,keep_alive_interval=1,read_timeout=60")
    store, seen = None, []
    log = tmp_path / "log"
    try:
        # Up before the agent imports torch; its store is not there yet, so it is in no round.
        assert wait_for(lambda: get(health_port), 30, "the health endpoint", ignore=(OSError,)) == \
            (503, "not in the rendezvous yet\n")
        store = start_store(store_port)
        wait_for(lambda: (tmp_path / "worker").exists(), 90, f"the worker; agent's log: {log}")
        assert get(health_port) == (200, "ok\n")
        os.kill(store.pid, signal.SIGSTOP)
        wait_for(lambda: answers(health_port, seen), 15, "the probe to see the stopped store",
                 until=lambda found: "accepts connections but has not answered" in found[1])
        assert {code for code, _ in seen} == {200}, seen
        store.kill()
        store.wait()
        wait_for(lambda: answers(health_port, seen), 15, "the probe to see the store gone",
                 until=lambda found: "gone for every agent" in found[1])
        assert {code for code, _ in seen} == {200}, seen
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if store is not None and store.poll() is None:
            store.kill()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Link:
    """A TCP relay between the agent and its store, which can cut the agent off as a lost network does: the
    bytes stop flowing both ways and new connects get no answer (its accept queue, of one, is left full, so
    the kernel drops their SYNs); healing lets everything held flow on."""

    def __init__(self, store_port: int) -> None:
        self.store_port, self.open = store_port, threading.Event()
        self.open.set()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.listener.settimeout(0.05)
        self.port, self.held, self.done = self.listener.getsockname()[1], [], threading.Event()
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while not self.done.is_set():
            if not self.open.is_set():
                time.sleep(0.05)
                continue
            try:
                near = self.listener.accept()[0]
            except TimeoutError:
                continue
            far = socket.create_connection(("127.0.0.1", self.store_port))
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.done.is_set():
            self.open.wait()
            try:
                data = source.recv(65536)
                sink.sendall(data)
            except OSError:
                data = b""
            if not data:
                for sock in (source, sink):
                    sock.close()
                return

    def cut(self) -> None:
        self.open.clear()
        time.sleep(0.1)  # the pumps and the accept loop are parked (a recv already waiting forwards one more read)
        self.held.append(socket.create_connection(("127.0.0.1", self.port)))  # fills the accept queue

    def heal(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.done.set()
        self.open.set()
        self.accepting.join(timeout=5)
        self.listener.close()
        for sock in self.held:
            sock.close()


def test_a_real_agent_cut_off_from_its_store_turns_unready_and_ready_again_once_it_answers(tmp_path):
    store_port, health_port = free_port_pair(), free_port_pair()
    store = start_store(store_port)
    link = Link(store_port)
    proc = agent(tmp_path, health_port, "--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{link.port}",
                 "--rdzv-id=health", "--rdzv-conf=is_host=false,keep_alive_interval=1,read_timeout=60")
    log, seen = tmp_path / "log", []
    try:
        wait_for(lambda: (tmp_path / "worker").exists(), 90, f"the worker; agent's log: {log}")
        assert get(health_port) == (200, "ok\n")
        link.cut()
        cut = time.monotonic()
        code, says = wait_for(lambda: answers(health_port, seen), 15, "the probe to see the pod cut off",
                              until=lambda found: found[0] != 200)
        assert code == 503 and says.startswith(f"no answer from the rendezvous store at 127.0.0.1:{link.port} for "), seen
        assert says.endswith(" s: this pod is cut off\n") and time.monotonic() - cut < health.FLOOR + 2, seen
        link.heal()  # the agent's pending store operation completes
        wait_for(lambda: get(health_port), 15, "the probe ready again", until=lambda found: found == (200, "ok\n"))
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        link.close()
        store.kill()
        store.wait()


def test_plain_torchrun_keeps_the_endpoint_its_pid_and_its_exit_status(tmp_path):
    """On a torch outside the range torchrun runs in this process (an exec would end the endpoint's thread):
    ready throughout, the worker a child of the agent, and torchrun's exit status for a failed worker."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(OTHER_VERSION)
    health_port = free_port_pair()
    proc = agent(tmp_path, health_port, "--standalone",
                 PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    try:
        wait_for(lambda: (tmp_path / "worker").exists(), 90, "the worker")
        assert get(health_port) == (200, "ok\n")
        assert (tmp_path / "worker").read_text() == f'{{"parent": {proc.pid}}}'
        (tmp_path / "stop").touch()
        assert proc.wait(timeout=60) == 1  # torchrun's, for a worker that exited 3
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "log").read_text()
    assert "running plain torchrun" in log and "exitcode  : 3" in log, log[-3000:]
