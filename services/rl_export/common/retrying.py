"""Starting a Kafka client while the broker may be away for a moment (a restart, a blip)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import KafkaError


async def start_when_reachable(
    start: Callable[[], Awaitable[None]],
    what: str,
    stop: asyncio.Event,
    log: logging.Logger,
    delay_s: float = 2.0,
) -> bool:
    """Call ``start`` until it succeeds (True) or ``stop`` is set (False).

    A client that cannot reach the broker raises a :class:`KafkaError` (or an ``OSError``)
    and can be started again; anything else is a real error and propagates.
    """
    while not stop.is_set():
        try:
            await start()
            return True
        except (KafkaError, OSError) as exc:
            log.warning("%s: cannot reach Kafka (%s); trying again in %.0fs", what, exc, delay_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay_s)
    return False
