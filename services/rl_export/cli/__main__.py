"""``python -m rl_export.cli``: the ``rl-export`` command line."""

import sys

from rl_export.cli import main

sys.exit(main())
