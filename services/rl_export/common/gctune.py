"""How the processes that run the stages tune CPython's cycle collector."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """Run CPython's cycle collector less often, and never over the start-up objects.

    The join and the sink allocate a hundred-odd objects per event, nearly all freed by
    reference counting; with the default generation-0 threshold (700 allocations) the cycle
    collector still ran every few events, and its older generations walked every module,
    schema and client object loaded at start. ``gc.freeze`` moves those out of its way, and
    a threshold of 50,000 lets it run once per few hundred events. In process this cut the
    join's time per event by about 7 %; garbage cycles (rare here: mostly failed futures)
    wait a little longer to be collected. A process that allocates little while it waits
    (a sink whose store is down) may not reach the threshold for minutes, so code whose
    failures leave large cycles collects them itself
    (:func:`rl_export.corpora.sink.free_refused_requests`).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
