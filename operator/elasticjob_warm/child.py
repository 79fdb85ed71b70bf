"""The forked worker: shed the server's state, take on the client's, run the target, exit.

Never returns: the caller is the server's loop, which must not go on in the child.
"""

from __future__ import annotations

import atexit
import io
import os
import sys
import threading
from typing import Any, cast

from elasticjob_warm import runner
from elasticjob_warm.protocol import Request, close_all


def become(request: Request, fds: list[int], closeables: list[Any]) -> None:
    code = 1
    try:
        close_all(closeables)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        close_all(list(set(fds) - {0, 1, 2}))
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        if request.unbuffered:
            cast(io.TextIOWrapper, sys.stdout).reconfigure(write_through=True)
            cast(io.TextIOWrapper, sys.stderr).reconfigure(write_through=True)
        _apply_thread_count(request.env)
        code = runner.run(request.argv)
    finally:
        _exit(code)


def _apply_thread_count(env: dict[str, str]) -> None:
    # torch sized its intra-op pool from the server's environment; torchrun sets OMP_NUM_THREADS per worker.
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _exit(code: int) -> None:
    # What the interpreter does at exit, without unwinding into the server's loop.
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

