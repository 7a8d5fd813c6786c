"""A pool's process ends when the process that started it is gone.

A process that is killed (SIGKILL, or SIGTERM's default) sends its ``ProcessPoolExecutor``'s
processes no word: they hold their own ends of the pool's pipes, so they never read an end
of file, and wait for work forever. :func:`end_with_parent`, a pool's initializer (or called
from one), starts a thread that ends the process within :data:`PARENT_CHECK_S` of its
parent going. The parent is the one the spawn recorded, not ``getppid()`` at the time: a
process still starting when its parent died has been handed to another parent already.

Public interface::

    def end_with_parent() -> None    # in a pool's process; nothing elsewhere
    PARENT_CHECK_S
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

PARENT_CHECK_S = 1.0
"""How often a pool's process looks whether its parent is still there."""


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def end_with_parent() -> None:
    """In a process a ``multiprocessing`` parent started: end it when that parent is gone.
    Elsewhere (a test calling a pool's initializer in its own process) nothing."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        threading.Thread(target=_watch, args=(parent.pid,), name="end-with-parent",
                         daemon=True).start()  # fmt: skip
