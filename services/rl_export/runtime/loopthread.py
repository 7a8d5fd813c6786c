"""An event loop in a thread of its own, for synchronous callers of asynchronous code.

The Hugging Face dataset (:mod:`rl_export.hf`) is iterated by trainers from any thread, or
from a notebook's running loop; the store's coroutines run on this loop instead, one per
process (a forked DataLoader worker gets its own), stopped when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class LoopThread:
    """One event-loop thread per process: the store's coroutines run there, whatever thread
    (or running loop, as in a notebook) iterates the dataset."""

    _current: LoopThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rl-export-hf",
                                       daemon=True)  # fmt: skip
        self.thread.start()

    @classmethod
    def get(cls) -> LoopThread:
        with cls._lock:
            # After a fork (DataLoader workers) the thread is gone: a new loop for the child.
            if cls._current is None or cls._current.pid != os.getpid():
                cls._current = cls()
            return cls._current

    def run(self, make: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for it (RuntimeError once the loop stopped:
        a dataset finalised while the interpreter exits)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("rl_export.hf: iterated from its own event-loop thread")
        if not self.loop.is_running():
            raise RuntimeError("rl_export.hf: the event loop has stopped")

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@atexit.register
def _stop_current() -> None:
    if LoopThread._current is not None and LoopThread._current.pid == os.getpid():
        LoopThread._current.stop()
