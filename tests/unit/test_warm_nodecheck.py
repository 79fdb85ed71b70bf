"""The node check before the join (elasticjob_warm/nodecheck.py): the CPU check here, its budget, its process
(`python -m elasticjob_warm.nodecheck`) and real agents (`python -m elasticjob_warm.torchrun`) that fail it or
pass it. Failures are injected at the matmul the check calls (a parameter, torch.matmul patched, or the
module's fault-injection hook ELASTICJOB_NODE_CHECK_FAULT in a real process), so the check's own comparison and
clock judge. No GPU here: the GPU part (check_gpus) is not run; the choice of its process is tested through the
device count given to start() or torch's device_count patched."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_warm_compat import OTHER_VERSION

from elasticjob_warm import nodecheck

ON = {nodecheck.CHECK_ENV: "1"}
CPU_PASSED = re.compile(r"elasticjob_warm\.torchrun: node check passed in \d+\.\d\d s "
                        r"\(float32 matmul 256x256 exact on cpu\)")
WRONG_LINE = "elasticjob_warm.torchrun: node check failed: matmul on cpu gave a wrong result: 1 of 65536 elements differ"
MATMUL = torch.matmul  # torch's own, as the tests below patch torch.matmul itself


def off_by_one(a, b):
    product = MATMUL(a, b)
    product[17, 3] += 1
    return product


def one_nan(a, b):
    product = MATMUL(a, b)
    product[255, 255] = float("nan")
    return product


def slow(seconds):
    def matmul(a, b):
        time.sleep(seconds)
        return MATMUL(a, b)
    return matmul


# ---------------------------------------------------------------- the check, in this process


def test_the_cpu_check_passes_on_this_machine():
    assert nodecheck.check_cpu() == "float32 matmul 256x256 exact on cpu"
    # Without a GPU the whole check is the CPU's.
    assert nodecheck.check(device_count=0) == "float32 matmul 256x256 exact on cpu"


@pytest.mark.parametrize(("matmul", "differ"), [
    (off_by_one, 1),
    (one_nan, 1),
    (lambda a, b: torch.matmul(a, b.T), None),  # another product altogether: most elements
    (lambda a, b: torch.matmul(a.half().float(), b) + 0.5, 65536),
])
def test_a_wrong_product_fails_the_check_saying_how_many_elements_differ(matmul, differ):
    with pytest.raises(nodecheck.Failed, match=r"^matmul on cpu gave a wrong result: (\d+) of 65536 elements "
                                               r"differ$") as failed:
        nodecheck.check_cpu(matmul)
    count = int(re.search(r"(\d+) of", str(failed.value))[1])
    assert count == differ if differ else count > 60000


def test_the_operands_are_exact_in_float32_and_the_same_every_time():
    a, b, want = nodecheck.operands()
    assert a.dtype == b.dtype == torch.float32 and want.dtype == torch.int64
    assert int(a.abs().max()) == int(b.abs().max()) == 8 and len(set(a.flatten().tolist())) == 17
    assert int(want.abs().max()) < 2 ** 24  # every partial sum too: at most 256 * 64
    assert all(torch.equal(x, y) for x, y in zip((a, b, want), nodecheck.operands()))


def test_a_check_over_its_budget_fails_with_the_budget_line_once_the_budget_is_spent():
    began = time.monotonic()
    running = nodecheck.Check.in_thread(0.3, lambda: nodecheck.check_cpu(slow(3)))
    assert running.verdict() == (False, "elasticjob_warm.torchrun: node check failed: the node check took "
                                        "longer than 0.3 s")
    assert 0.3 <= time.monotonic() - began < 2  # not the 3 s the matmul takes
    # Within its budget the same slow matmul passes.
    assert nodecheck.Check.in_thread(5, lambda: nodecheck.check_cpu(slow(0.2))).verdict()[0]


def test_the_agents_check_goes_through_torch_matmul_and_its_budget(monkeypatch, capfd):
    monkeypatch.setattr(torch, "matmul", slow(3))
    running = nodecheck.start({**ON, nodecheck.SECONDS_ENV: "0.25"}, device_count=0)
    assert running.process is None and not running.wait()
    assert capfd.readouterr().err == ("elasticjob_warm.torchrun: node check failed: the node check took longer than "
                                      "0.25 s\n")
    monkeypatch.setattr(torch, "matmul", off_by_one)
    assert not nodecheck.start(ON, device_count=0).wait()
    assert capfd.readouterr().err == WRONG_LINE + "\n"
    monkeypatch.undo()
    assert nodecheck.start(ON, device_count=0).wait()
    assert CPU_PASSED.fullmatch(capfd.readouterr().err.strip())


@pytest.mark.parametrize(("environ", "budget"), [
    ({}, None),
    ({nodecheck.CHECK_ENV: "0"}, None),
    ({nodecheck.CHECK_ENV: ""}, None),
    ({nodecheck.CHECK_ENV: "0", nodecheck.SECONDS_ENV: "soon"}, None),  # no check: its budget is not read
    (ON, 30.0),
    ({**ON, nodecheck.SECONDS_ENV: "2.5"}, 2.5),
    ({**ON, nodecheck.SECONDS_ENV: "soon"}, ValueError),
    ({**ON, nodecheck.SECONDS_ENV: "0"}, ValueError),
    ({**ON, nodecheck.SECONDS_ENV: "-3"}, ValueError),
    ({nodecheck.CHECK_ENV: "yes"}, ValueError),
    ({**ON, nodecheck.FAULT_ENV: "gpu"}, ValueError),
])
def test_the_environment_asks_for_the_check_and_its_budget(environ, budget):
    if budget is ValueError:
        with pytest.raises(ValueError, match="ELASTICJOB_NODE_CHECK"):
            nodecheck.budget(environ)
    else:
        assert nodecheck.budget(environ) == budget
        check = nodecheck.start(environ, device_count=0)
        assert (check is None) == (budget is None)
        # Waited for: a check thread still inside torch when the interpreter ends aborts it (exit 134).
        assert check is None or check.wait()


# ---------------------------------------------------------------- its process


def standalone(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "elasticjob_warm.nodecheck", *argv], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


def test_the_standalone_check_passes_here_with_one_line_and_exit_0():
    done = standalone()
    assert done.returncode == 0 and CPU_PASSED.fullmatch(done.stderr.strip()), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_the_standalone_check_fails_with_86_and_the_agents_line():
    done = standalone(ELASTICJOB_NODE_CHECK_FAULT="matmul")
    assert (done.returncode, done.stderr) == (86, WRONG_LINE + "\n")
    began = time.monotonic()
    done = standalone("--budget", "0.5", ELASTICJOB_NODE_CHECK_FAULT="slow")  # the matmul sleeps an hour
    assert (done.returncode, done.stderr) == (86, "elasticjob_warm.torchrun: node check failed: the node check "
                                                  "took longer than 0.5 s\n")
    assert time.monotonic() - began < 30  # torch's import and the budget, not the hour


def test_with_a_gpu_the_check_runs_in_a_process_of_its_own(capfd):
    """device_count > 0: `python -m elasticjob_warm.nodecheck` (which sees no GPU here, so checks the CPU), never
    in the agent; its line is the agent's one line, whatever it says."""
    running = nodecheck.start({**os.environ, **ON}, device_count=2)
    assert running.process is not None and running.thread is None
    assert running.process.args[1:] == ["-m", "elasticjob_warm.nodecheck", "--budget", "30"]
    assert running.wait() and running.process.returncode == 0
    assert CPU_PASSED.fullmatch(capfd.readouterr().err.strip())
    running = nodecheck.start({**os.environ, **ON, nodecheck.FAULT_ENV: "matmul"}, device_count=1)
    assert not running.wait() and running.process.returncode == 86
    assert capfd.readouterr().err == WRONG_LINE + "\n"
    running = nodecheck.start({**os.environ, **ON, nodecheck.FAULT_ENV: "crash"}, device_count=1)  # SIGKILLed
    assert not running.wait()
    assert capfd.readouterr().err == ("elasticjob_warm.torchrun: node check failed: the node check's process was "
                                      "killed by SIGKILL\n")


def test_the_device_count_comes_from_torch(monkeypatch):
    assert nodecheck.start(ON).process is None  # this machine's torch sees no GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    running = nodecheck.start({**os.environ, **ON})
    assert running.process is not None and running.verdict()[0]


def test_a_check_process_that_does_not_end_is_killed_and_fails_the_check(monkeypatch):
    monkeypatch.setattr(nodecheck, "IMPORT_SECONDS", 0)  # no time for its import: it cannot have ended
    began = time.monotonic()
    running = nodecheck.start({**os.environ, **ON, nodecheck.SECONDS_ENV: "0.2"}, device_count=1)
    passed, line = running.verdict()
    assert not passed and line.startswith("elasticjob_warm.torchrun: node check failed: the node check took longer "
                                          "than 0.2 s (its process had not ended 0.2 s after it started"), line
    assert running.process.returncode == -9 and time.monotonic() - began < 5


# ---------------------------------------------------------------- real agents

WORKER = textwrap.dedent("""
    import os, sys
    open(os.path.join(sys.argv[1], "trained"), "w").write(os.environ["RANK"])
""")
RUN_ID = "nodecheck"
KEY = f"torch.rendezvous.{RUN_ID}"  # the c10d backend writes it as the agent reaches the rendezvous


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=10))


def agent(tmp_path, store, *argv: str, **env_extra: str) -> tuple[int, str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, ELASTICJOB_WARM_SOCKET=str(tmp_path / "warm.sock"), ELASTICJOB_WARM_PRELOAD="decimal",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **env_extra)
    with open(tmp_path / "log", "w") as log:  # the server keeps the agent's stderr: a pipe would not end
        proc = subprocess.Popen([sys.executable, "-m", "elasticjob_warm.torchrun", "--max-restarts=0",
                                 "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                 f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={RUN_ID}",
                                 "--rdzv-conf=is_host=false", *argv, str(script),
                                 str(tmp_path)], env=env, stdout=log, stderr=log)
        proc.wait(timeout=120)
    return proc.returncode, (tmp_path / "log").read_text()


def stop_notices(tmp_path: Path) -> None:
    """The cold agent's plain-torchrun notice (elasticjob_warm/notice.py) is detached and waits 15 minutes for the
    store, which this test's fixture closes long before: stop the ones this test started (their environment names
    its tmp_path), or they outlive the suite."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"elasticjob_warm.notice" in (proc / "cmdline").read_bytes() and \
                    str(tmp_path).encode() in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


def check_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "node check" in line]


@pytest.mark.parametrize("argv", [(), ("--no-python", sys.executable)], ids=["warm", "cold"])
def test_an_agent_on_a_failing_node_exits_86_with_one_line_and_never_reaches_the_rendezvous(tmp_path, store,
                                                                                                argv):
    try:
        code, log = agent(tmp_path, store, *argv, ELASTICJOB_NODE_CHECK="1", ELASTICJOB_NODE_CHECK_FAULT="matmul")
    finally:
        stop_notices(tmp_path)
    assert code == 86 and check_lines(log) == [WRONG_LINE], log[-3000:]
    assert not store.check([KEY]), "the agent wrote the rendezvous state"
    assert not (tmp_path / "trained").exists() and "joining the rendezvous" not in log


def test_an_agent_on_a_good_node_checks_it_then_joins_and_trains(tmp_path, store):
    code, log = agent(tmp_path, store, ELASTICJOB_NODE_CHECK="1")
    assert code == 0 and (tmp_path / "trained").read_text() == "0", log[-3000:]
    [line] = check_lines(log)
    assert CPU_PASSED.fullmatch(line), log[-3000:]
    assert log.index(line) < log.index("joining the rendezvous"), log[-3000:]  # checked, then joined
    assert store.check([KEY])  # the sign the test above looks for is there once an agent joins


def test_without_the_check_asked_for_nothing_is_checked(tmp_path, store):
    code, log = agent(tmp_path, store, ELASTICJOB_NODE_CHECK="0", ELASTICJOB_NODE_CHECK_FAULT="matmul")
    assert code == 0 and (tmp_path / "trained").exists() and check_lines(log) == [], log[-3000:]


def test_plain_torchrun_checks_nothing(tmp_path, store):
    """A torch the wrapper was not tested on runs plain torchrun, untouched: no check either."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(OTHER_VERSION)
    code, log = agent(tmp_path, store, ELASTICJOB_NODE_CHECK="1", ELASTICJOB_NODE_CHECK_FAULT="matmul",
                      PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    assert code == 0 and "running plain torchrun" in log and check_lines(log) == [], log[-3000:]


def test_a_bad_setting_is_refused_before_anything_runs(tmp_path, store):
    code, log = agent(tmp_path, store, ELASTICJOB_NODE_CHECK="1", ELASTICJOB_NODE_CHECK_SECONDS="soon")
    assert code == 2 and "ELASTICJOB_NODE_CHECK_SECONDS='soon'" in log and not store.check([KEY]), log[-3000:]
