"""``python -m kvbench``: the same as the ``kvbench`` command."""

import sys

from kvbench.cli import main

sys.exit(main())
