import sys

from elasticjob_kit.install import main

sys.exit(main(sys.argv[1:]))
