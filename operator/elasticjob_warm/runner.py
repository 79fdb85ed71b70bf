"""Run a worker's target in this process as `python SCRIPT ARGS` or `python -m MODULE ARGS` would, and say
how it ended as an exit code. Used by the forked worker and by the client's cold fallback."""

from __future__ import annotations

import os
import runpy
import sys
import traceback


def run(argv: list[str]) -> int:
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                raise SystemExit("elasticjob_warm: -m needs a module name")
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as exit_:
        return exit_code(exit_.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:  # noqa: BLE001 - the script's own failure, reported as Python would
        traceback.print_exc()
        return 1


def exit_code(code: object) -> int:
    """SystemExit's argument as the process's exit status, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
