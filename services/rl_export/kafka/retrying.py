"""Starting a Kafka client while the broker may be away for a moment (a restart, a blip)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

# The broker's ACLs refused the client: no retry can help, the caller names what is missing.
AUTHORIZATION_FAILED = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    ClusterAuthorizationFailedError,
)


async def start_when_reachable(
    start: Callable[[], Awaitable[None]],
    what: str,
    stop: asyncio.Event,
    log: logging.Logger,
    *,
    delay_s: float = 2.0,
    check: Callable[[], Awaitable[object]] | None = None,
) -> bool:
    """Call ``start`` until it succeeds (True) or ``stop`` is set (False).

    A client that cannot reach the broker raises a :class:`KafkaError` (or an ``OSError``)
    and can be started again; anything else is a real error and propagates, and so does a
    refusal by the broker's ACLs (``AUTHORIZATION_FAILED``). After a failure ``check``
    (``KafkaConnection.check``) asks the broker why: a refused TLS handshake or SASL
    authentication raises there, and ends the process instead of retrying forever.
    """
    while not stop.is_set():
        try:
            await start()
            return True
        except AUTHORIZATION_FAILED:
            raise
        except (KafkaError, OSError) as exc:
            if check is not None:
                await check()
            log.warning("%s: cannot reach Kafka (%s); trying again in %.0fs", what, exc, delay_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay_s)
    return False


async def stop_quietly(stop: Callable[[], Awaitable[None]], what: str, log: logging.Logger) -> None:
    """Call a Kafka client's ``stop`` when the broker may be gone; never raise for that.

    aiokafka's consumer ends its fetches on stop and, if a fetch was waiting to retry an
    unreachable broker, lets that fetch's ``CancelledError`` out of ``stop()`` although
    nobody cancelled us. That, and a :class:`KafkaError`, mean only that the broker was
    away: logged, not raised, so that what follows the stop (closing the producers and the
    stores) still runs. A cancellation of our own task propagates.
    """
    try:
        await stop()
    except (KafkaError, OSError) as exc:
        log.warning("%s: stopped while Kafka was unreachable (%r)", what, exc)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("%s: stopped while Kafka was unreachable", what)
