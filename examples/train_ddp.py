"""Elastic DDP training that survives restarts, joins and lost nodes.

Run it under torchrun (the ElasticJob operator does): the agent sets RANK, WORLD_SIZE and
LOCAL_RANK for every run, and the world size may differ from one run to the next. Every run
resumes from the latest checkpoint, so a restart loses at most --checkpoint-every steps.

    torchrun --nnodes=1:3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \
        train_ddp.py --steps 100 --checkpoint-dir /ckpt

Each rank appends one JSON line per completed step to --progress-file, which is what the
end-to-end tests read to see what training actually did.

Three habits make recovery fast and lose nothing:
- Before the operator removes workers (a scale-down, a suspension, Kueue's preemption), and when a worker pod is
  evicted or its node drained (the pod's agent asks on SIGTERM), a planned stop: elasticjob_progress's
  should_stop(step) turns true on every rank at the same step; rank 0 saves it (DDP keeps every rank's model
  identical after a step) and waits until it is on the volume, and every rank calls stopped(step), which holds
  the process until it is ended. The next run resumes from that step: none is done again. Where no stop could
  be planned (an image without the package, stopGraceSeconds 0), SIGTERM does it instead: the rank finishes its
  step, saves and exits 0; the others cannot step on without it, so nothing newer can be overwritten. A rank
  stuck in a collective (its peer is gone) leaves at once once its step has run three times its usual length
  (half a second at least), and after --sigterm-grace seconds at most, instead of holding up the group.
- Checkpoints through elasticjob_ckpt where it is installed: a save copies the state into the pod's memory and
  returns, and a thread writes it to --checkpoint-dir behind; a worker restarted on the same pod loads it from
  memory, one on a new pod from the volume. Without the package, torch.save and torch.load on the volume.
- When a collective fails (a peer died, the group is being restarted) the rank logs the error and leaves with
  os._exit(1) at once: a normal interpreter exit tears torch down for over a second, which the whole group
  waits for before it can re-form.
"""

import argparse
import contextlib
import datetime
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:  # the operator's progress API: in its worker image and its kit; shown in the job's downtime ledger
    import elasticjob_progress
except ImportError:  # run without it (another image, plain torchrun): report nothing
    elasticjob_progress = None

try:  # the operator's in-memory checkpoints: in its worker image and its kit
    import elasticjob_ckpt
except ImportError:  # torch.save and torch.load on the volume instead
    elasticjob_ckpt = None

CHECKPOINT_NAME = "checkpoint.pt"
# elasticjob_ckpt's name for rank 0's checkpoint: one for the job, as rank 0 alone saves (on whichever pod it is).
CKPT_NAME = "train"


class NoProgress:
    """elasticjob_progress.Progress's calls, doing nothing: where the package is not installed."""

    def step(self, n): pass
    def saved(self, n): pass
    def loading(self): pass
    def loaded(self, n): pass
    def should_stop(self, n): return False  # SIGTERM (Stop) stands in
    def stopped(self, n): pass
    def watch(self, model): pass


def make_progress(use_api=True):
    return elasticjob_progress.Progress() if elasticjob_progress is not None and use_api else NoProgress()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("ELASTICJOB_CHECKPOINT_DIR", "/tmp/elasticjob-checkpoint"))
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step, to slow training down")
    parser.add_argument("--busy-while", metavar="PATH",
                        help="spin the CPU for --step-seconds instead of sleeping while PATH exists (load for an HPA)")
    parser.add_argument("--forward-matmuls", type=int, default=0,
                        help="256x256 matmuls added to each forward: compute a throttled CPU or a slow GPU slows")
    parser.add_argument("--progress-file", help="default: <checkpoint-dir>/progress.jsonl")
    parser.add_argument("--events-file", help="checkpoints saved on SIGTERM; default: <checkpoint-dir>/events.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sigterm-grace", type=float, default=2.0,
                        help="seconds after SIGTERM to finish the step and save, before leaving anyway")
    # For bench/steps_lost.py: the script as users write it without these habits.
    parser.add_argument("--no-progress-api", action="store_true",
                        help="do not use elasticjob_progress (no planned stop reaches the script)")
    parser.add_argument("--no-sigterm-save", action="store_true",
                        help="no SIGTERM handler: SIGTERM ends the process where it is, as Python's default")
    # Fault injection for the operator's tests.
    parser.add_argument("--fail-exit-code", type=int, help="every run exits with this code at its first step")
    parser.add_argument("--hang-at-step", type=int, help="rank 0 blocks at this step, once per checkpoint dir")
    parser.add_argument("--fail-on-marked-node", metavar="DIR",
                        help="every process exits 1 at its start and at each step while DIR holds a file named as "
                             "its node (env NODE_NAME): a sick node, as a GPU that fails every start")
    parser.add_argument("--oom-at-step", type=int,
                        help="rank 0 allocates memory until the kernel kills it at this step, once per checkpoint dir")
    args = parser.parse_args(argv)
    args.progress_file = args.progress_file or os.path.join(args.checkpoint_dir, "progress.jsonl")
    args.events_file = args.events_file or os.path.join(args.checkpoint_dir, "events.jsonl")
    return args


class Work(torch.nn.Module):
    """A fixed amount of compute in the forward, with no parameter (nothing more to all-reduce or checkpoint): a
    slow node makes it slow, as it would a real model's layers."""

    def __init__(self, matmuls):
        super().__init__()
        self.matmuls = matmuls
        self.operand = torch.ones(256, 256) / 256  # not a buffer: DDP would broadcast it at every forward

    def forward(self, x):
        operand = self.operand.to(x.device)
        for _ in range(self.matmuls):
            operand = operand @ self.operand.to(x.device)
        return x + 0 * operand[0, 0]


def build_model(forward_matmuls=0):
    layers = [torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)]
    return torch.nn.Sequential(*layers, *([Work(forward_matmuls)] if forward_matmuls else []))


def synthetic_batch(seed, step, rank, device):
    # The batch depends only on (seed, step, rank), so a resumed run sees the data it would have seen.
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    inputs = torch.randn(16, 32, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True) * 0.1
    return inputs.to(device), targets.to(device)


def make_checkpointer(directory):
    """elasticjob_ckpt's Checkpointer for rank 0's checkpoint; None without the package."""
    return elasticjob_ckpt.Checkpointer(directory, name=CKPT_NAME) if elasticjob_ckpt is not None else None


def load_checkpoint(path, model, optimizer, ckpt=None):
    """The step of the newest checkpoint loaded (0: none) and where it came from: memory, volume, file, None."""
    found = []
    if ckpt is not None:
        loaded = ckpt.load()
        if loaded is not None:
            found.append(({**loaded.state, "step": loaded.step}, loaded.source))
    if os.path.exists(path):  # torch.save's: a run without elasticjob_ckpt, or a rank but 0 saving on SIGTERM
        found.append((torch.load(path, map_location="cpu"), "file"))
    if not found:
        return 0, None
    state, source = max(found, key=lambda pair: pair[0]["step"])
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"], source


def save_checkpoint(path, model, optimizer, step, ckpt=None, persisted=False):
    """Through elasticjob_ckpt: returns once the state is in memory; with `persisted`, once it is on the volume
    too (a stop: the pod, and its memory, may go next). Without it: write then rename, so a worker killed
    mid-save leaves the previous checkpoint intact."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if ckpt is not None:
        ckpt.save(state, step)
        if persisted:
            ckpt.wait()
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({**state, "step": step}, tmp)
    os.replace(tmp, path)


def agreed_start_step(step, device):
    # Rank 0's checkpoint wins, so every rank runs the same number of steps.
    tensor = torch.tensor([step], dtype=torch.int64, device=device)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())


def step_timer():
    """A context manager per step: the agent's watchdog kills a worker whose step overruns."""
    timer_file = os.environ.get("TORCHELASTIC_TIMER_FILE")
    if not timer_file:
        return contextlib.nullcontext
    from torch.distributed.elastic import timer

    timer.configure(timer.FileTimerClient(timer_file))
    timeout = float(os.environ.get("ELASTICJOB_STEP_TIMEOUT_SECONDS", "60"))
    return lambda: timer.expires(after=timeout)


def first_time(args, what, rank, step, at_step) -> bool:
    """Whether rank 0 is at `at_step` and has not done `what` before in this checkpoint dir (a marker file)."""
    if at_step != step or rank != 0:
        return False
    marker = os.path.join(args.checkpoint_dir, f"{what}-at-step-{step}")
    if os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


def hang_once(args, rank, step):
    if not first_time(args, "hung", rank, step, args.hang_at_step):
        return
    print(f"rank 0 hanging at step {step}", flush=True)
    while True:
        time.sleep(3600)


def oom_once(args, rank, step):
    """Grows past the container's memory limit: the kernel's OOM killer ends this process (the largest in the
    container's cgroup), not torchrun's agent."""
    if not first_time(args, "oom", rank, step, args.oom_at_step):
        return
    print(f"rank 0 allocating memory at step {step} until it is killed", flush=True)
    hoard = []
    while True:
        hoard.append(bytearray(b"\x01") * (64 << 20))  # written, so every page is really taken


def pause(args):
    """The rest of a step: asleep, or busy on the CPU while the --busy-while file exists (the test that drives
    an autoscaler turns the load on and off from outside, whatever the world does in between)."""
    if not (args.busy_while and os.path.exists(args.busy_while)):
        time.sleep(args.step_seconds)
        return
    deadline = time.monotonic() + args.step_seconds
    while time.monotonic() < deadline:
        pass


# A step under way this many times its usual length (and this many seconds at least) on SIGTERM is stuck.
STUCK_STEPS = 3
STUCK_FLOOR = 0.5


class Stop:
    """SIGTERM asks for a checkpoint at the end of the current step, then an exit.

    A Python signal handler runs only between bytecodes, and a rank blocked in a collective whose peer is gone
    never gets there: torchrun would wait its 30 s shutdown timeout before SIGKILL. So a thread learns of the
    signal at once (through the wakeup fd) and, if no step boundary comes within `grace` seconds, leaves.
    """

    requested = False
    holding = False  # a planned stop was saved: the process only waits for its end (SIGTERM ends it at once)
    began = None  # when the step under way began (time.monotonic()); None between steps
    typical = None  # seconds a step takes, a running mean

    @classmethod
    @contextlib.contextmanager
    def step(cls):
        cls.began = time.monotonic()
        try:
            yield
        finally:
            took, cls.began = time.monotonic() - cls.began, None
            cls.typical = took if cls.typical is None else cls.typical + 0.2 * (took - cls.typical)

    @classmethod
    def stuck(cls, now):
        """A step under way for several times its usual length waits on a peer that is gone (a partition, a lost
        node: no reset reaches the collective): no step boundary will come, so waiting out the grace is lost."""
        began, typical = cls.began, cls.typical
        return began is not None and typical is not None and now - began > max(STUCK_STEPS * typical, STUCK_FLOOR)

    @classmethod
    def install(cls, grace: float):
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the thread below does the work
        threading.Thread(target=cls._watch, args=(read_end, grace), daemon=True).start()

    @classmethod
    def _watch(cls, read_end: int, grace: float):
        while os.read(read_end, 1) != bytes([signal.SIGTERM]):
            pass
        cls.requested = True
        deadline = time.monotonic() + grace
        # The main loop saves and exits within one step; if not, it is stuck.
        while not cls.holding and (now := time.monotonic()) < deadline:
            if cls.stuck(now):
                print(f"SIGTERM: the step under way took {now - cls.began:.1f}s, over {STUCK_STEPS} times its "
                      f"usual {cls.typical:.2f}s (stuck in a collective); leaving", flush=True)
                break
            time.sleep(0.02)  # a clock to read, not a condition to wait on: the main loop never signals it
        else:
            if not cls.holding:
                print(f"SIGTERM: no step finished within {grace}s (stuck in a collective?); leaving", flush=True)
        os._exit(143)


def leave_now(rank, error):
    """A collective failed: say why, then exit without Python's slow teardown."""
    print(f"rank {rank}: collective failed, leaving for the group to re-form: {error}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def append_progress(path, record):
    # One write() of one short line with O_APPEND: lines from concurrent ranks do not interleave.
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@dataclass
class Run:
    """One run of this rank: what torchrun gave it and what it resumed from."""

    args: argparse.Namespace
    rank: int
    world_size: int
    local_rank: int
    restart_count: int
    device: torch.device
    model: torch.nn.Module
    ddp_model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    checkpoint: str
    resumed_from: int
    host: str
    started: float
    progress: object = None  # elasticjob_progress.Progress, or NoProgress
    ckpt: object = None  # elasticjob_ckpt.Checkpointer, or None: torch.save
    loaded_from: str = None  # where the checkpoint resumed from came from: memory, volume, file; None: none

    def save(self, step, persisted=False):
        # elasticjob_ckpt's files have one writer per name: rank 0. Another rank saves only on SIGTERM, plainly.
        ckpt = self.ckpt if self.rank == 0 else None
        save_checkpoint(self.checkpoint, self.model, self.optimizer, step, ckpt, persisted)


def start(args) -> Run:
    started = time.time()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    fail_if_node_marked(args, rank)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    torch.manual_seed(args.seed)
    model = build_model(args.forward_matmuls).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    checkpoint = os.path.join(args.checkpoint_dir, CHECKPOINT_NAME)
    progress = make_progress(not args.no_progress_api)
    ckpt = make_checkpointer(args.checkpoint_dir)
    progress.loading()
    loaded_step, loaded_from = load_checkpoint(checkpoint, model, optimizer, ckpt)
    resumed_from = agreed_start_step(loaded_step, device)
    progress.loaded(resumed_from)
    # The model every rank starts from is rank 0's (DDP broadcasts it); the optimizer's state is each rank's own.
    ddp_model = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    progress.watch(ddp_model)  # every rank: its forward's time, so that a slow node is seen and replaced
    host = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
    return Run(args, rank, world_size, local_rank, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), device,
               model, ddp_model, optimizer, checkpoint, resumed_from, host, started, progress, ckpt,
               loaded_from if loaded_step == resumed_from else None)


def main(argv=None):
    args = parse_args(argv)
    # SIGTERM saves too where the operator planned no stop (an eviction, a drain, a stop it could not ask for).
    if not args.no_sigterm_save:
        Stop.install(args.sigterm_grace)
    run = start(args)
    print(f"rank {run.rank}/{run.world_size} on {run.host} resuming from step {run.resumed_from} "
          f"(restart {run.restart_count})", flush=True)
    try:
        train(run, step_timer())
    except (RuntimeError, dist.DistError) as error:  # gloo/nccl: a peer is gone or the group restarts
        leave_now(run.rank, error)
    if Stop.requested:
        print(f"rank {run.rank}: stopped by SIGTERM after saving a checkpoint", flush=True)
        sys.stdout.flush()
        os._exit(0)  # the checkpoint is on disk; torch's teardown would only delay the group
    dist.destroy_process_group()
    print(f"rank {run.rank} done at step {args.steps} ({datetime.datetime.now().isoformat(timespec='seconds')})",
          flush=True)


def fail_if_node_marked(args, rank: int) -> None:
    """A sick node stands in for a GPU that throws an error at every start: exit 1 at once."""
    node = os.environ.get("NODE_NAME", "")
    if args.fail_on_marked_node and node and os.path.exists(os.path.join(args.fail_on_marked_node, node)):
        print(f"rank {rank} failing on purpose: node {node} is marked sick", flush=True)
        os._exit(1)


def train(run: Run, timed_step) -> None:
    args = run.args
    for step in range(run.resumed_from + 1, args.steps + 1):
        fail_if_node_marked(args, run.rank)
        if args.fail_exit_code is not None:
            print(f"rank {run.rank} failing on purpose with exit code {args.fail_exit_code}", flush=True)
            sys.exit(args.fail_exit_code)
        with timed_step(), Stop.step():
            hang_once(args, run.rank, step)
            oom_once(args, run.rank, step)
            inputs, targets = synthetic_batch(args.seed, step, run.rank, run.device)
            loss = torch.nn.functional.mse_loss(run.ddp_model(inputs), targets)
            run.optimizer.zero_grad()
            loss.backward()
            run.optimizer.step()
            pause(args)
        append_progress(args.progress_file, {
            "step": step, "rank": run.rank, "world_size": run.world_size, "local_rank": run.local_rank,
            "restart_count": run.restart_count, "resumed_from": run.resumed_from, "loaded_from": run.loaded_from,
            "loss": round(loss.item(), 6),
            "pid": os.getpid(), "host": run.host, "started": run.started, "time": time.time(),
            # Which world: rank 0's store for this round. Two worlds stepping at once would be split brain.
            "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        })
        run.progress.step(step)
        if run.progress.should_stop(step):  # the operator's planned stop: every rank at this same step
            if run.rank == 0:
                run.save(step, persisted=True)  # on the volume before the pod, and its memory, may go
                run.progress.saved(step)
            append_progress(args.events_file, {"event": "checkpoint-on-stop", "step": step, "rank": run.rank,
                                               "host": run.host, "time": time.time()})
            Stop.holding = True
            run.progress.stopped(step)  # holds the process until the operator ends it
            return
        if Stop.requested:
            run.save(step, persisted=True)
            run.progress.saved(step)
            append_progress(args.events_file, {"event": "checkpoint-on-sigterm", "step": step, "rank": run.rank,
                                               "host": run.host, "time": time.time()})
            return
        if run.rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
            run.save(step, persisted=step == args.steps)  # in memory; on the volume behind, the last at once
            run.progress.saved(step)


if __name__ == "__main__":
    main()
