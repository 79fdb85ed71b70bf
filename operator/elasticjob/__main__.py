import sys

from elasticjob.cli import main

sys.exit(main())
