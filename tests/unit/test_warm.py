"""Warm worker starts (elasticjob_warm): real client and server processes, small scripts in a temporary dir.

The server preloads `decimal` here instead of torch (ELASTICJOB_WARM_PRELOAD): a script that finds it
already imported was forked from the server; the client itself never imports it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from helpers import wait_for

REPORT = textwrap.dedent("""
    import json, os, sys
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
               "marker": os.environ.get("MARKER"), "preloaded": "decimal" in sys.modules,
               "pgid": os.getpgid(0)}, open(os.environ["REPORT"], "w"))
    print("to stdout"); print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("EXIT", "0")))
""")


@pytest.fixture
def warm(tmp_path):
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"), ELASTICJOB_WARM_PRELOAD="decimal",
               REPORT=str(tmp_path / "report.json"))
    yield env
    server = server_pid(env["ELASTICJOB_WARM_SOCKET"])
    if server:
        os.kill(server, signal.SIGKILL)


def server_pid(path: str) -> int | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        return None
    with sock:
        return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]


def script(tmp_path, text: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def client(env, *argv, **kwargs) -> subprocess.Popen:
    # stderr to a file: the server a client starts keeps that client's stderr (the pod's log, in a pod), so a
    # pipe would never reach its end.
    with open(env["REPORT"] + ".err", "w") as err:
        return subprocess.Popen([sys.executable, "-u", "-m", "elasticjob_warm", *argv], env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True, **kwargs)


def run(env, *argv, **kwargs) -> tuple[int, str, str, dict]:
    proc = client(env, *argv, **kwargs)
    out, _ = proc.communicate(timeout=60)
    err = open(env["REPORT"] + ".err").read()
    return proc.returncode, out, err, json.load(open(env["REPORT"]))


def test_the_worker_is_forked_from_the_server_with_the_clients_argv_env_cwd_and_output(warm, tmp_path):
    job = script(tmp_path, REPORT)
    workdir = tmp_path / "work"
    workdir.mkdir()
    first = run(dict(warm, MARKER="one", EXIT="3"), job, "--lr", "0.1", cwd=workdir)
    second = run(dict(warm, MARKER="two"), job, cwd=tmp_path)
    code, out, err, report = first
    assert (code, out, "to stderr" in err) == (3, "to stdout\n", True)
    assert report["argv"] == [job, "--lr", "0.1"] and report["cwd"] == str(workdir) and report["marker"] == "one"
    assert report["preloaded"] and report["ppid"] == server_pid(warm["ELASTICJOB_WARM_SOCKET"])
    assert report["pgid"] == report["pid"]  # a group of its own, which the client's forwarded signals reach
    assert (second[0], second[3]["marker"], second[3]["ppid"]) == (0, "two", report["ppid"])


def test_module_form(warm, tmp_path):
    script(tmp_path, REPORT, name="jobmod.py")
    code, _, _, report = run(dict(warm, EXIT="4"), "-m", "jobmod", "x", cwd=tmp_path)
    assert (code, report["argv"][1:], report["preloaded"]) == (4, ["x"], True)


def test_without_a_server_the_script_runs_cold_in_the_client(warm, tmp_path):
    # A socket directory others may enter is refused: no server starts there, the script runs here.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    env = dict(warm, ELASTICJOB_WARM_SOCKET=str(shared / "warm.sock"), EXIT="5")
    code, out, err, report = run(env, script(tmp_path, REPORT))
    assert (code, out, report["preloaded"]) == (5, "to stdout\n", False)
    assert "not a directory private to uid" in err and "cold" in err
    assert not (shared / "warm.sock").exists()


def test_a_signal_sent_to_the_clients_group_reaches_the_worker(warm, tmp_path):
    job = script(tmp_path, """
        import os, signal, sys, time
        def leave(*_):
            open(os.environ["REPORT"] + ".term", "w").write("saved")
            sys.exit(0)
        signal.signal(signal.SIGTERM, leave)
        print("ready", flush=True)
        time.sleep(60)
        sys.exit(9)
    """)
    proc = client(warm, job)
    assert proc.stdout.readline() == "ready\n"
    os.killpg(proc.pid, signal.SIGTERM)  # as torchrun stops a worker
    assert proc.wait(timeout=30) == 0
    assert open(warm["REPORT"] + ".term").read() == "saved"


def test_a_worker_killed_by_a_signal_ends_its_client_by_the_same_signal(warm, tmp_path):
    job = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = client(warm, job)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_client_takes_its_worker_with_it(warm, tmp_path):
    job = script(tmp_path, """
        import os, time
        open(os.environ["REPORT"], "w").write(str(os.getpid()))
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = client(warm, job)
    assert proc.stdout.readline() == "ready\n"
    worker = int(open(warm["REPORT"]).read())
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: alive(worker), 10, f"worker {worker} to be killed with its client", until=lambda a: not a,
             interval=0.02)


def test_clients_starting_together_share_one_server(warm, tmp_path):
    job = script(tmp_path, """
        import json, os, sys
        json.dump(os.getppid(), open(sys.argv[1], "w"))
    """)
    procs = [client(warm, job, str(tmp_path / f"r{i}")) for i in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    parents = {json.load(open(tmp_path / f"r{i}")) for i in range(3)}
    assert parents == {server_pid(warm["ELASTICJOB_WARM_SOCKET"])}


def test_a_garbled_request_leaves_the_server_serving(warm, tmp_path):
    job = script(tmp_path, REPORT)
    assert run(warm, job)[0] == 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(warm["ELASTICJOB_WARM_SOCKET"])
        sock.sendall(b"garbage")
    code, _, _, report = run(dict(warm, EXIT="6"), job)
    assert (code, report["preloaded"]) == (6, True)


def test_the_server_leaves_with_its_agent(warm, tmp_path):
    # The "agent" is the client's parent, as torchrun's agent is: a process that runs one worker, then waits.
    job = script(tmp_path, REPORT)
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-m", "elasticjob_warm", {job!r}], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        print("done", flush=True)
        sys.stdin.read()
    """)], env=warm, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert agent.stdout.readline() == "done\n"
    server = server_pid(warm["ELASTICJOB_WARM_SOCKET"])
    agent.kill()
    agent.wait(timeout=10)
    wait_for(lambda: alive(server), 10, f"server {server} to leave after its agent", until=lambda a: not a,
             interval=0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited: only its parent has yet to reap it
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_socket_served_by_anyone_else_gets_nothing(warm, tmp_path):
    # Whoever listens on the path first (here: not a warm server) must not get the worker's descriptors,
    # argv or environment; the worker runs cold and says why.
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(warm["ELASTICJOB_WARM_SOCKET"])
    impostor.listen(1)
    heard: list[bytes] = []

    def listen():
        conn, _ = impostor.accept()
        with conn:
            conn.settimeout(5)
            try:
                heard.append(conn.recv(1 << 16))
            except TimeoutError:
                heard.append(b"(silence)")

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    code, _, err, report = run(dict(warm, EXIT="3"), script(tmp_path, REPORT))
    listener.join(timeout=10)
    impostor.close()
    assert heard == [b""]
    assert (code, report["preloaded"]) == (3, False)
    assert "not an elasticjob_warm server" in err and "cold" in err


def test_a_lock_held_for_ever_costs_a_cold_start_not_a_hang(warm, tmp_path):
    sock_path = warm["ELASTICJOB_WARM_SOCKET"]
    job = script(tmp_path, REPORT)
    with open(sock_path + ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code = ("import sys; from elasticjob_warm import client\n"
                "client.LOCK_TIMEOUT = 0.5\n"
                f"sys.exit(client.main([{job!r}]))\n")
        result = subprocess.run([sys.executable, "-c", code], env=dict(warm, EXIT="4"), capture_output=True,
                                text=True, timeout=30)
    assert result.returncode == 4, result.stderr
    assert "lock was held for more than" in result.stderr and "cold" in result.stderr
    assert not json.load(open(warm["REPORT"]))["preloaded"]


def gated_preload(tmp_path) -> tuple[Path, dict[str, str]]:
    """A preload that blocks until the returned FIFO is written to (an import that takes as long as the test
    wants), and the environment that gives it to a server."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    (tmp_path / "slow_import.py").write_text(f"open({str(gate)!r}).read()\n")
    return gate, {"ELASTICJOB_WARM_PRELOAD": "slow_import",
                  "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def test_a_probe_is_closed_only_once_the_server_has_preloaded(warm, tmp_path, monkeypatch):
    from elasticjob_warm import client as warm_client

    gate, preload = gated_preload(tmp_path)
    for name, value in preload.items():  # the server connect_or_start spawns takes this process's environment
        monkeypatch.setenv(name, value)
    path = warm["ELASTICJOB_WARM_SOCKET"]
    early = warm_client.probe(warm_client.connect_or_start(path, os.getpid()))
    assert not warm_client.until_warm(early, 0.5)  # still importing: nothing answers
    gate.write_text("go")
    late = warm_client.probe(warm_client.connect_or_start(path, os.getpid()))
    assert warm_client.until_warm(late, 30)
    code, _out, _err, report = run(dict(warm, **preload), script(tmp_path, REPORT))
    assert code == 0 and report["ppid"] == server_pid(path)  # and it still serves workers after the probes
