"""`python -m elasticjob_warm.torchrun [torchrun's options] SCRIPT [ARGS...]`: torchrun, with warm workers
whose server starts with the container, and shorter rendezvous polls (polling.py).

`torchrun -m elasticjob_warm SCRIPT` starts the server with the pod's first worker, which therefore still pays
the import. Here this process is torchrun's agent itself: it starts the server first, so that torch is imported
there while the agent imports its own and waits for its round, and then runs torchrun with SCRIPT behind
`-m elasticjob_warm`. Options and exit status are torchrun's own. What no warm server can start (--no-python,
--run-path) runs as written, cold. Either way the agent reads the rendezvous state through a decoder that runs
nothing (statecheck.py), rides out a lost store (outage.py), and on SIGTERM (an eviction, a node drain) has the
training save at an agreed step before torchrun stops the workers (evicted.py). With ELASTICJOB_HEALTH_PORT it
answers the kubelet's readiness probe from its store's answers (health.py), from its first moment on. With
ELASTICJOB_NODE_CHECK=1 it checks its node while the server imports, and a node that fails joins no round
(nodecheck.py); with ELASTICJOB_SEATS=1 (a job with spares) it joins only once the store gives it a seat, and
waits warm as a spare until then (seat.py); with ELASTICJOB_LINK_PROBE=1 the agents of each round of 3 or more
measure their links before their workers start (roundprobe.py). An agent that its rendezvous ends (a closed
round, a state refused, no store) with no worker of it failed exits RENDEZVOUS_EXIT after one line, not
torchrun's 1 (rdzvexit.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from elasticjob_warm import (
    client,
    compat,
    evicted,
    health,
    nodecheck,
    notice,
    outage,
    polling,
    protocol,
    rdzvexit,
    roundprobe,
    seat,
    statecheck,
)

# The longest the agent waits for its server's imports before it joins the rendezvous regardless (a preload
# that hangs would hang the workers as well; this only bounds the agent's part).
WARM_WAIT = 30.0
# A wait for the warm server shorter than this is its reply's round trip: it was warm already.
WARM_SLACK = 0.05


def main(argv: list[str]) -> int:
    endpoint = notice.endpoint(argv, dict(os.environ))  # the job's store, as torchrun will read it
    ready = health.start(endpoint, dict(os.environ))  # answers the kubelet at once
    if problem := compat.version_problem(compat.torch_version()):
        return plain(argv, problem, ready)
    started = time.monotonic()
    server = start_server()
    from torch.distributed import run  # after the server has started importing torch beside us
    from torch.distributed.elastic.multiprocessing.errors import record

    if problem := compat.agent_problem(run):
        # The server started above idles and leaves with this process: no worker asks it for anything.
        return plain(argv, problem, ready)
    try:  # beside the server's imports (torch is imported here now); it is waited for just before the join
        check = nodecheck.start(dict(os.environ))
    except ValueError as error:
        print(f"elasticjob_warm.torchrun: {error}", file=sys.stderr)
        return 2
    args = run.parse_args(argv)
    patch_rendezvous(ready, args)
    evicted.install(endpoint, dict(os.environ))  # SIGTERM: save first
    try:
        polling.apply(args.nnodes)
    except ValueError as error:
        print(f"elasticjob_warm.torchrun: {error}", file=sys.stderr)
        return 2
    cold = cold_reason(args)
    if cold:  # torchrun runs the command as written, still with the patches above; the operator is told
        print(f"elasticjob_warm.torchrun: the workers start cold (no warm server): {cold}", file=sys.stderr,
              flush=True)
        tell_operator(argv, cold)
        if server is not None:
            server.close()
    else:
        args.training_script_args = [*(["-m"] if args.module else []), args.training_script,
                                     *args.training_script_args]
        args.training_script, args.module = "elasticjob_warm", True
    checked_at = time.monotonic()
    if check is not None and not check.wait():  # one line either way; a failed node joins no round
        return nodecheck.NODE_CHECK_EXIT
    held = time.monotonic() - checked_at
    if server is not None and not cold and join_when_warm(server, started) > WARM_SLACK:
        held = 0.0  # the server's imports outlasted the check: the join waited for them, not for it
    if check is not None:
        nodecheck.report_later(endpoint, args.local_addr, check.took or held, held)
    try:
        record(run.run)(args)
    except Exception as error:
        if rdzvexit.exit_code(error) is None:
            raise  # torchrun's own exit: a worker failed (ChildFailedError), or an error that is not the rendezvous'
        return rdzvexit.leave(error)
    return 0


def cold_reason(args: Any) -> str | None:
    """Why torchrun's parsed arguments run workers that no warm server can fork; None when they start warm."""
    if args.no_python:
        return "--no-python runs the command itself as each worker, not Python that a warm server could fork"
    if getattr(args, "run_path", False):
        return "--run-path runs the script in workers that torchrun spawns itself (runpy), not through a command"
    return None


def patch_rendezvous(ready: health.Health | None, args: Any) -> None:
    """The agent's own rendezvous: it reads the state without pickle.loads, rides out a lost store, and counts
    its store's answers for the readiness probe."""
    if ready is not None and health.watch(ready, getattr(args, "rdzv_conf", None)) is None:
        print("elasticjob_warm.torchrun: this torch's rendezvous backend is not the one known; the health "
              "endpoint answers ok whatever the store does", file=sys.stderr, flush=True)
    if why := statecheck.apply():
        print(f"elasticjob_warm.torchrun: {why}; the agent reads the rendezvous state with torch's pickle.loads, "
              "as torchrun does", file=sys.stderr, flush=True)
    if not outage.apply():
        print("elasticjob_warm.torchrun: this torch's rendezvous handler is not the one known; a lost store ends "
              "the agent, as in torchrun", file=sys.stderr, flush=True)
    if not seat.apply(ready.answered if ready is not None else lambda: None):
        print("elasticjob_warm.torchrun: this torch's rendezvous handler is not the one known; the agent joins "
              "without asking for a seat (a spare trains too)", file=sys.stderr, flush=True)
    try:
        if not roundprobe.apply():
            print("elasticjob_warm.torchrun: this torch's agent is not the one known; the round's links are not "
                  "probed", file=sys.stderr, flush=True)
    except ValueError as error:
        print(f"elasticjob_warm.torchrun: {error}; the round's links are not probed", file=sys.stderr, flush=True)
    if not rdzvexit.apply():
        print("elasticjob_warm.torchrun: this torch's agent is not the one known; an agent its rendezvous ends "
              "exits 1, as in torchrun", file=sys.stderr, flush=True)


def plain(argv: list[str], why: str, ready: health.Health | None = None) -> int:
    """torchrun itself, in this process (same pid, same exit status), with nothing of ours patched in.
    With a health endpoint, torchrun's main runs here, beside the endpoint's thread, which answers ok throughout
    (an exec would end that thread and leave the pod unready for ever); without one, torchrun is exec'd."""
    print(f"elasticjob_warm.torchrun: running plain torchrun (no warm worker starts, no shorter rendezvous "
          f"polls): {why}", file=sys.stderr, flush=True)
    tell_operator(argv, why)
    if ready is not None:
        ready.always = True  # no store answers are counted on a torch this cannot see into
        try:
            from torch.distributed.run import main as torchrun_main
        except ImportError as error:
            print(f"elasticjob_warm.torchrun: no torch.distributed.run.main ({error}): torchrun is exec'd, and the "
                  f"health endpoint goes with this process", file=sys.stderr, flush=True)
        else:
            torchrun_main(argv)  # torchrun's own errors leave as they do from `python -m torch.distributed.run`
            return 0
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *argv])
    return 127  # not reached: execv replaces this process or raises


def tell_operator(argv: list[str], why: str) -> None:
    """Through the job's store (notice.py), detached: torchrun must not wait for it."""
    address = notice.endpoint(argv, dict(os.environ))
    if address:
        subprocess.Popen([sys.executable, "-m", "elasticjob_warm.notice", address, why], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_server() -> socket.socket | None:
    """Our workers' clients will look for the server of their parent, which is this process, at a path
    nobody else can guess: torchrun hands our environment to every worker. Returns the connection that
    started it, for join_when_warm."""
    if not os.environ.get(protocol.SOCKET_ENV):
        os.environ[protocol.SOCKET_ENV] = protocol.new_socket_path()
    try:
        # A probe at once: were it open when the server accepts it, the server would wait for its request.
        return client.probe(client.connect_or_start(protocol.socket_path(os.getpid()), os.getpid()))
    except (client.Unavailable, OSError) as error:
        print(f"elasticjob_warm.torchrun: no warm server yet ({error}); the first worker will start one",
              file=sys.stderr, flush=True)
        return None


def join_when_warm(server: socket.socket, started: float) -> float:
    """The agent joins the rendezvous once the server has preloaded. A running group restarts as soon as a
    newcomer waits to join (a replaced pod, a restarted container, a scale-up), and then every rank waits in
    its first collective for the newcomer's worker, which the server forks only after its imports: joining
    early would stop the whole group for the rest of them, where waiting costs only this agent's own time.
    At a start of the whole job it costs the rendezvous' own few tenths of a second, which overlapped the
    imports before. Returns the seconds it waited here."""
    waited_from = time.monotonic()
    warm = client.until_warm(server, WARM_WAIT)
    took = time.monotonic() - started
    if warm:
        print(f"elasticjob_warm.torchrun: workers warm {took:.1f} s after the agent started; joining the "
              f"rendezvous", file=sys.stderr, flush=True)
    else:
        print(f"elasticjob_warm.torchrun: the warm server is still importing after {took:.1f} s; joining the "
              f"rendezvous anyway (its workers start once it is done)", file=sys.stderr, flush=True)
    return time.monotonic() - waited_from


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
