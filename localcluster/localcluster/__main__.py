import sys

from localcluster.cli import main

sys.exit(main())
