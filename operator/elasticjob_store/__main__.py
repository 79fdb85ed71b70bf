"""`python -m elasticjob_store`: what the rendezvous pod runs."""

import signal

# Blocked before anything starts a thread (the c10d server, the gate and the control endpoint do), so that only
# main()'s sigwait receives them: a thread with these unblocked would take the default action and exit 143, not 0.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

from elasticjob_store.main import main  # noqa: E402  (after the mask, on purpose)

main()
