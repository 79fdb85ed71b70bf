"""`python -m elasticjob_warm.torchrun [torchrun's options] SCRIPT [ARGS...]`: torchrun, with warm workers
whose server starts with the container, and shorter rendezvous polls (polling.py).

`torchrun -m elasticjob_warm SCRIPT` starts the server with the pod's first worker, which therefore still pays
the import. Here this process is torchrun's agent itself: it starts the server first, so that torch is imported
there while the agent imports its own and waits for its round, and then runs torchrun with SCRIPT behind
`-m elasticjob_warm`. Options and exit status are torchrun's own.
"""

from __future__ import annotations

import os
import subprocess
import sys

from elasticjob_warm import client, compat, notice, outage, polling, protocol


def main(argv: list[str]) -> int:
    if problem := compat.version_problem(compat.torch_version()):
        return plain(argv, problem)
    start_server()
    from torch.distributed import run  # after the server has started importing torch beside us
    from torch.distributed.elastic.multiprocessing.errors import record

    if problem := compat.agent_problem(run):
        # The server started above idles and leaves with this process: no worker asks it for anything.
        return plain(argv, problem)
    args = run.parse_args(argv)
    if args.no_python:
        print("elasticjob_warm.torchrun: --no-python runs no Python worker to start warm; use torchrun itself",
              file=sys.stderr)
        return 2
    if not outage.apply():
        print("elasticjob_warm.torchrun: this torch's rendezvous handler is not the one known; a lost store ends "
              "the agent, as in torchrun", file=sys.stderr, flush=True)
    try:
        polling.apply(args.nnodes)
    except ValueError as error:
        print(f"elasticjob_warm.torchrun: {error}", file=sys.stderr)
        return 2
    args.training_script_args = [*(["-m"] if args.module else []), args.training_script,
                                 *args.training_script_args]
    args.training_script, args.module = "elasticjob_warm", True
    record(run.run)(args)
    return 0


def plain(argv: list[str], why: str) -> int:
    """torchrun itself, in this process (same pid, same exit status), with nothing of ours patched in."""
    print(f"elasticjob_warm.torchrun: running plain torchrun (no warm worker starts, no shorter rendezvous "
          f"polls): {why}", file=sys.stderr, flush=True)
    address = notice.endpoint(argv, dict(os.environ))
    if address:  # the operator learns it through the job's store; torchrun must not wait for that
        subprocess.Popen([sys.executable, "-m", "elasticjob_warm.notice", address, why], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *argv])
    return 127  # not reached: execv replaces this process or raises


def start_server() -> None:
    """Our workers' clients will look for the server of their parent, which is this process, at a path
    nobody else can guess: torchrun hands our environment to every worker."""
    if not os.environ.get(protocol.SOCKET_ENV):
        os.environ[protocol.SOCKET_ENV] = protocol.new_socket_path()
    try:
        client.connect_or_start(protocol.socket_path(os.getpid()), os.getpid()).close()
    except (client.Unavailable, OSError) as error:
        print(f"elasticjob_warm.torchrun: no warm server yet ({error}); the first worker will start one",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
