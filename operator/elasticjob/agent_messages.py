"""What an agent's last log lines say (a pod's termination message): torchrun giving up on its workers, the worker
exit code, the kit's node check failing, the rendezvous ending the agent, the store lost. Pure string reading;
nothing here decides whether a failure is charged (that is the operator's own evidence: planner/failures.py)."""

from __future__ import annotations

import re

# torchrun's own words when it gives up on its workers: the exception line, then the Root Cause block whose
# "exitcode  : 3 (pid: 18)" line names the worker's code. The termination message is the log's tail, which the
# workload writes too: only these lines, in torchrun's exact format, are read, and nothing in them decides
# whether a failure is charged (that is the operator's own evidence: failures.classify).
_CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
_ROOT_CAUSE = "Root Cause (first observed failure):"
_ROOT_EXITCODE = re.compile(r"^  exitcode  : (-?\d+) \(pid: \d+\)$")
# What an agent that lost its store logs last. Only a reason to wait a little for the operator's own evidence of
# the loss (a worker's failure can be seen before the store's): it decides nothing.
STORE_LOST = ("RendezvousConnectionError", "RendezvousClosedError")
# The kit's check of its node before the agent joins (elasticjob_warm/nodecheck.py): this exit code and this line.
NODE_CHECK_EXIT = 86
_NODE_CHECK_FAILED = "elasticjob_warm.torchrun: node check failed: "
# A rank held after a planned stop that nobody ended leaves with this code (elasticjob_progress STOP_EXPIRED_EXIT):
# the worker's exit code, as its agent reports it (its Root Cause block, or its "failed (exitcode: N)" line).
STOP_EXPIRED_EXIT = 85
# The kit's agent when the rendezvous, not a worker, ended it (elasticjob_warm/rdzvexit.py): this exit code and
# this line, naming the error's type.
RENDEZVOUS_EXIT = 87
_RENDEZVOUS_ENDED = "elasticjob_warm.torchrun: the rendezvous ended this agent: "
_ERROR_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def parse_agent_message(message: str) -> tuple[bool, int | None]:
    """From torchrun's last log lines (the termination message): did it give up on its workers
    (ChildFailedError, after its restarts were used up), and with which worker exit code (its Root Cause block,
    else its last "failed (exitcode: N)" line)."""
    lines = [line.rstrip() for line in message.splitlines()]
    gave_up = _CHILD_FAILED in lines
    if gave_up and _ROOT_CAUSE in lines:
        after = lines[lines.index(_ROOT_CAUSE):]
        code = next((int(m.group(1)) for line in after if (m := _ROOT_EXITCODE.match(line))), None)
        if code is not None:
            return True, code
    last = last_worker_failure(message)
    return gave_up, last[1] if last else None


# torchrun's agent, each time a worker fails: "E1122 23:01:44.105000 18 .../api.py:1002] failed (exitcode: 3) ..."
_FAILED_LINE = re.compile(r"^[EWI](\d{4} \d\d:\d\d:\d\d\.\d+)\b.*\bfailed \(exitcode: (-?\d+)\)")


def last_worker_failure(log: str) -> tuple[str, int, str] | None:
    """The last worker failure an agent logged: (its glog time 'MMDD hh:mm:ss.ffffff', exit code, line)."""
    found = None
    for line in log.splitlines():
        if (match := _FAILED_LINE.match(line.strip())) is not None:
            found = (match.group(1), int(match.group(2)), line.strip()[-512:])
    return found


def node_check_failure(message: str) -> str | None:
    """Why the kit's node check failed, from the agent's last lines: the agent exits NODE_CHECK_EXIT right after it,
    before it joined any round (so no worker of it ran)."""
    found = [line.strip()[len(_NODE_CHECK_FAILED):] for line in message.splitlines()
             if line.strip().startswith(_NODE_CHECK_FAILED)]
    return found[-1][:512] if found else None


def rendezvous_failure(message: str) -> str | None:
    """The type of the rendezvous error that ended the kit's agent, from its last lines: the agent exits
    RENDEZVOUS_EXIT right after its line, and only where no worker of it failed."""
    found = [line.strip()[len(_RENDEZVOUS_ENDED):] for line in message.splitlines()
             if line.strip().startswith(_RENDEZVOUS_ENDED)]
    return found[-1] if found and _ERROR_TYPE.match(found[-1]) else None
