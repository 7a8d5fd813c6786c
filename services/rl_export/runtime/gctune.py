"""How the project's processes tune memory management: CPython's cycle collector, and the
allocators of the processes that read corpora."""

from __future__ import annotations

import ctypes
import gc
import os
import sys

_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


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


def lean_allocators(arenas: int = 2) -> None:
    """Keep what a reading process frees from staying in its allocators' caches: glibc's
    malloc at most ``arenas`` arenas (what ``MALLOC_ARENA_MAX`` sets) and pyarrow on the
    system allocator instead of its default mimalloc pool (``ARROW_DEFAULT_MEMORY_POOL``),
    unless the environment already says either. Called before the first thread starts and
    before pyarrow is imported; the arenas only on glibc.

    glibc gives each thread that allocates an arena of its own, up to eight per core, and
    each arena keeps the memory freed into it; mimalloc keeps its pages too. An export reads
    objects, sidecars and hashes in worker threads: measured on the 1,000,000-record export,
    peak RSS 252 MiB with the defaults, 200 MiB with two arenas, 155 MiB (the latest view
    alone) with the system allocator as well, in the same time.
    """
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_ARENA_MAX, arenas)
