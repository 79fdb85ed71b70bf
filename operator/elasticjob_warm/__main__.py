"""`python -m elasticjob_warm SCRIPT [ARGS...]` (or `-m MODULE [ARGS...]`): a worker that torchrun starts."""

import sys

from elasticjob_warm.client import main

sys.exit(main(sys.argv[1:]))
