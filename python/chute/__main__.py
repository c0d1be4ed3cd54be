"""``python -m chute``: the same command line as the ``chute`` script."""

import sys

from chute.cli import main

sys.exit(main())
