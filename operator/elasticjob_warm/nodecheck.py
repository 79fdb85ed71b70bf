"""The node check: before its agent joins a round, the node shows that it computes right.

GPU fleets lose time to nodes that stay bad: a GPU that throws an Xid or an ECC error, or one whose products are
wrong. With ELASTICJOB_NODE_CHECK=1 (the operator sets it) `elasticjob_warm.torchrun` checks its node while the
warm server imports, and joins the rendezvous only once the check has passed. A node that fails says why in one
line of stderr, `elasticjob_warm.torchrun: node check failed: <reason>`, and the agent exits NODE_CHECK_EXIT
having joined no round and started no worker. "0" or no value: no check, nothing changes.

What is checked:
- the CPU: a float32 matmul of small integers (each product at most 64, each sum at most SIZE * 64: exact in
  float32 whatever the order of the additions) against the same product in int64, element by element;
- each visible GPU (torch.cuda.device_count(): NVML's count, no CUDA context): the same matmul there, and with two
  or more an all-reduce across them (torch.cuda.nccl) of known values. Any CUDA error (an Xid shows as one)
  fails the check, naming the device.

Where: with no GPU, in a thread of the agent. torch is imported there anyway, so the check costs its few
milliseconds of work and nothing else; a process of its own would import torch a third time (the agent and the
warm server do already) on the CPUs both are importing on. With GPUs, all of it (CPU part included) runs in
`python -m elasticjob_warm.nodecheck`: a CUDA context in the agent would hold GPU memory for the job's whole
life, and CUDA does not survive the warm server's fork.

ELASTICJOB_NODE_CHECK_SECONDS (default 30) bounds the check's own work, from when torch is imported: a check not
done by then fails ("the node check took longer than N s"), which is how a node far too slow is caught, and a
hung CUDA call is a failure, not a hang. torch's import is not counted (on a cold image it says nothing of the
node), but the agent gives the check's process at most IMPORT_SECONDS for it.

What the check cost the join is told to the job's store (report_later): under KEY_PREFIX + the agent's address
(--local-addr), the check's own seconds and how long it held the join, `held` (0 when the warm server's imports
held the join longer anyway). The store shows it to the operator, whose ledger books it as the nodeCheck phase.

`python -m elasticjob_warm.nodecheck [--budget SECONDS]` runs the whole check here (for an admin; it is also the
agent's process on a GPU node): exit 0 or NODE_CHECK_EXIT, with the agent's line.

ELASTICJOB_NODE_CHECK_FAULT is a fault-injection hook for tests, never set by the operator. It replaces the
matmul the check calls, so that the check's own comparison and clock judge: `matmul` returns every product with
one element off by one, `slow` sleeps an hour first, `crash` SIGKILLs the process calling it (a crash in the
driver; in the agent's own thread that is the agent).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from elasticjob_warm import notice, polling

if TYPE_CHECKING:
    import torch

    Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

CHECK_ENV = "ELASTICJOB_NODE_CHECK"
SECONDS_ENV = "ELASTICJOB_NODE_CHECK_SECONDS"
FAULT_ENV = "ELASTICJOB_NODE_CHECK_FAULT"
FAULTS = ("matmul", "slow", "crash")
DEFAULT_SECONDS = 30.0
NODE_CHECK_EXIT = 86
IMPORT_SECONDS = 30.0  # the check's process, on top of its budget, for its torch import: torchrun.WARM_WAIT
SIZE = 256
REDUCE_ELEMENTS = 1 << 20  # 4 MiB of float32 per GPU: NCCL splits it into chunks along its rings
PREFIX = "elasticjob_warm.torchrun: node check "
# elasticjob_store/nodechecks.py reads these (a unit test keeps the two equal).
KEY_PREFIX = "elasticjob.nodecheck."
REPORT_VERSION = 1
REPORT_WAIT = 30.0  # the longest the report's thread waits for the store (the gate holds an unnamed pod ~20 s)


class Failed(Exception):
    """The node is not fit to train; the message says why."""


def budget(environ: Mapping[str, str]) -> float | None:
    """The check's budget in seconds when ELASTICJOB_NODE_CHECK asks for the check, else None. Raises ValueError
    for a value that is neither (the agent then refuses to start, as for its other settings)."""
    asked = environ.get(CHECK_ENV) or "0"
    if asked not in ("0", "1"):
        raise ValueError(f"{CHECK_ENV}={asked!r}: expected 1 (check the node before joining) or 0")
    if (fault := environ.get(FAULT_ENV)) and fault not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={fault!r}: a fault-injection hook for tests, one of {', '.join(FAULTS)}")
    if asked == "0":
        return None
    return polling.bounded_seconds(SECONDS_ENV, environ.get(SECONDS_ENV) or str(DEFAULT_SECONDS), 3600)


def too_long(seconds: float) -> str:
    return f"the node check took longer than {seconds:g} s"


def passed_line(seconds: float, what: str) -> str:
    return f"{PREFIX}passed in {seconds:.2f} s ({what})"


def failed_line(reason: str) -> str:
    return f"{PREFIX}failed: {reason}"


def operands(size: int = SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two float32 matrices of integers from -8 to 8, the same every time, and their product in int64."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-8, 9, (size, size), generator=generator, dtype=torch.int64) for _ in range(2))
    return a.float(), b.float(), a @ b


def compare(got: torch.Tensor, want: torch.Tensor, device: str) -> None:
    wrong = int((got.cpu().double() != want).count_nonzero())  # a NaN differs too
    if wrong:
        raise Failed(f"matmul on {device} gave a wrong result: {wrong} of {want.numel()} elements differ")


def cuda_error(error: Exception) -> str:
    """An exception from CUDA in one line (torch adds lines of advice about CUDA_LAUNCH_BLOCKING)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"


def check_cpu(matmul: Matmul | None = None) -> str:
    """Raises Failed when the CPU's float32 product differs from int64's; says what it checked."""
    import torch

    a, b, want = operands()
    compare((matmul or torch.matmul)(a, b), want, "cpu")
    return f"float32 matmul {SIZE}x{SIZE} exact on cpu"


def check_gpus(count: int, matmul: Matmul | None = None) -> str:
    """The matmul on each of `count` GPUs against the CPU's int64 product, then an all-reduce across them."""
    import torch
    from torch.cuda import nccl

    a, b, want = operands()
    for index in range(count):
        device = f"cuda:{index}"
        try:
            got = (matmul or torch.matmul)(a.to(device), b.to(device)).cpu()  # .cpu() waits for the kernel
        except Exception as error:  # noqa: BLE001 - whatever CUDA raises, the device is not fit
            raise Failed(f"{device}: {cuda_error(error)}") from None
        compare(got, want, device)
    if count == 1:
        return "cuda:0"
    devices = f"cuda:0 to cuda:{count - 1}"
    base = torch.arange(REDUCE_ELEMENTS, dtype=torch.float32) % 1024
    try:
        tensors = [(base + index).to(f"cuda:{index}") for index in range(count)]
        if not nccl.is_available(tensors):
            return f"{devices}; no all-reduce: this torch has no NCCL"
        nccl.all_reduce(tensors)  # in place: each holds the sum
        results = [tensor.cpu() for tensor in tensors]
    except Exception as error:  # noqa: BLE001
        raise Failed(f"nccl all-reduce over {devices}: {cuda_error(error)}") from None
    want_sum = base * count + count * (count - 1) // 2  # below 2**24: exact
    for index, result in enumerate(results):
        if wrong := int((result != want_sum).count_nonzero()):
            raise Failed(f"nccl all-reduce over {devices} gave a wrong result on cuda:{index}: {wrong} of "
                         f"{REDUCE_ELEMENTS} elements differ")
    return f"{devices}; nccl all-reduce over {count} GPUs"


def check(matmul: Matmul | None = None, device_count: int = 0) -> str:
    """The whole check, here: the CPU, then each GPU. Raises Failed; says what it checked."""
    done = check_cpu(matmul)
    return f"{done}, {check_gpus(device_count, matmul)}" if device_count else done


def matmul_for(environ: Mapping[str, str]) -> Matmul:
    """torch.matmul, or the fault FAULT_ENV names (tests only; see the module's docstring)."""
    import torch

    fault = environ.get(FAULT_ENV)

    def faulty(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "slow":
            time.sleep(3600)
        product = torch.matmul(a, b)
        if fault == "matmul":
            product[0, 0] += 1
        return product

    return faulty if fault else torch.matmul


class Check:
    """A check under way: in a thread of this process or in a process of its own. wait() for its verdict."""

    def __init__(self, seconds: float) -> None:
        self.budget, self.began = seconds, time.monotonic()
        self.took: float | None = None  # the check's own seconds, once it ended
        self.thread: threading.Thread | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._verdict: tuple[bool, str] | None = None  # (passed, the line to log), set once known

    @classmethod
    def in_thread(cls, seconds: float, work: Callable[[], str]) -> Check:
        """`work` (it says what it checked, or raises Failed) in a daemon thread: past the budget it is left
        running, and a process that exits does not wait for it."""
        running = cls(seconds)

        def run() -> None:
            try:
                what = work()
            except Failed as failure:
                running._verdict = False, failed_line(str(failure))
            except Exception as error:  # noqa: BLE001 - a check that cannot run has not passed
                running._verdict = False, failed_line(f"the check raised {type(error).__name__}: {error}")
            else:
                running._verdict = True, passed_line(time.monotonic() - running.began, what)
            finally:
                running.took = time.monotonic() - running.began

        running.thread = threading.Thread(target=run, name="elasticjob-node-check", daemon=True)
        running.thread.start()
        return running

    @classmethod
    def in_process(cls, seconds: float, environ: Mapping[str, str]) -> Check:
        """`python -m elasticjob_warm.nodecheck` with this budget, its stderr kept for its line."""
        running = cls(seconds)
        running.process = subprocess.Popen(
            [sys.executable, "-m", "elasticjob_warm.nodecheck", "--budget", f"{seconds:g}"], env=dict(environ),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return running

    def verdict(self) -> tuple[bool, str]:
        """Waits, within the budget, for whether the check passed and the line that says so."""
        if self.process is not None:
            return self._process_verdict(self.process)
        assert self.thread is not None
        self.thread.join(max(0.0, self.began + self.budget - time.monotonic()))
        return self._verdict or (False, failed_line(too_long(self.budget)))

    def _process_verdict(self, process: subprocess.Popen[bytes]) -> tuple[bool, str]:
        limit = self.budget + IMPORT_SECONDS
        try:
            _, err = process.communicate(timeout=max(0.0, self.began + limit - time.monotonic()))
            self.took = time.monotonic() - self.began  # its process's torch import included
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return False, failed_line(f"{too_long(self.budget)} (its process had not ended {limit:g} s after it "
                                      f"started, torch's import included)")
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        said = [line for line in lines if line.startswith(PREFIX)]
        if said and process.returncode in (0, NODE_CHECK_EXIT):
            return process.returncode == 0, said[-1]
        code = process.returncode
        ended = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return False, failed_line(f"the node check's process {ended}" + (f": {lines[-1]}" if lines else ""))

    def wait(self) -> bool:
        """Logs the one line of the verdict; True when the check passed."""
        passed, line = self.verdict()
        print(line, file=sys.stderr, flush=True)
        return passed


def report_body(seconds: float, held: float, at: float) -> bytes:
    """What the store reads (elasticjob_store/nodechecks.py checks every field)."""
    return json.dumps({"v": REPORT_VERSION, "seconds": round(seconds, 3), "held": round(held, 3),
                       "at": round(at, 3)}).encode()


def report_later(endpoint: str | None, addr: str | None, seconds: float, held: float) -> threading.Thread | None:
    """Writes the check's cost to the job's store in a daemon thread: the join must not wait for it, and a store
    that never answers costs nothing but the thread. None where there is no store or no address to key it by."""
    if not endpoint or not addr:
        return None
    body = report_body(seconds, held, time.time())

    def write() -> None:
        from datetime import timedelta

        import torch.distributed

        dist: Any = torch.distributed  # TCPStore is not in its stubs
        try:
            store = dist.TCPStore(*notice.host_port(endpoint), is_master=False, timeout=timedelta(seconds=REPORT_WAIT))
            store.set(KEY_PREFIX + addr, body)
        except Exception as error:  # noqa: BLE001 - the ledger goes without it; training does not
            print(f"{PREFIX}cost not reported to the store: {type(error).__name__}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=write, name="elasticjob-node-check-report", daemon=True)
    thread.start()
    return thread


def start(environ: Mapping[str, str], device_count: int | None = None) -> Check | None:
    """The check the environment asks for, started: None when it asks for none. Raises ValueError for a setting
    that is not one. `device_count` is torch.cuda.device_count() unless given (tests give it)."""
    seconds = budget(environ)
    if seconds is None:
        return None
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()  # NVML's count where it answers: no CUDA context here
    if device_count > 0:
        return Check.in_process(seconds, environ)
    matmul = matmul_for(environ)
    return Check.in_thread(seconds, lambda: check_cpu(matmul))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m elasticjob_warm.nodecheck",
                                     description="Check this node's CPU and GPUs as the agent does before it joins.")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help=f"the check's time budget (default: {SECONDS_ENV}, else {DEFAULT_SECONDS:g})")
    args = parser.parse_args(argv)
    try:
        seconds = budget({**os.environ, CHECK_ENV: "1"})  # FAULT_ENV checked too
    except ValueError as error:
        parser.error(str(error))
    if args.budget is not None:
        seconds = args.budget
    if seconds is None or not 0 < seconds <= 3600:
        parser.error(f"--budget {args.budget}: expected seconds, more than 0 and at most 3600")
    import torch  # before the clock starts: an import on a cold image says nothing of the node

    matmul = matmul_for(os.environ)
    count = torch.cuda.device_count()
    running = Check.in_thread(seconds, lambda: check(matmul, count))
    passed, line = running.verdict()
    print(line, file=sys.stderr, flush=True)
    if running.thread is not None and running.thread.is_alive():
        os._exit(NODE_CHECK_EXIT)  # a CUDA call that hangs would hang the interpreter's exit as well
    return 0 if passed else NODE_CHECK_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
