"""``python -m rl_export.join_process PARENT_PID PORT``: a worker's join, in its own process.

Started only by the worker (:class:`rl_export.worker.ChildJoins`), never by hand.
"""

from __future__ import annotations

import sys

from rl_export.worker import run_join_process

if __name__ == "__main__":
    if len(sys.argv) != 3 or not all(a.isdigit() for a in sys.argv[1:]):
        sys.exit("usage: python -m rl_export.join_process PARENT_PID PORT (the worker runs this)")
    sys.exit(run_join_process(int(sys.argv[1]), int(sys.argv[2])))
