"""Run by Python at start-up in the processes of ``make bench-ceiling``'s second variant.

Its folder is put on their ``PYTHONPATH`` (:func:`tests.perf.ceiling.replay_variant`)
and nowhere else: with ``CEILING_REPLAY_OUTPUTS`` set, the join processors of the process
replay those outputs instead of joining (:func:`tests.perf.ceiling.install`).
"""

import os
from pathlib import Path

_outputs = os.environ.get("CEILING_REPLAY_OUTPUTS")
if _outputs:
    from tests.perf.ceiling import install

    install(Path(_outputs))
