"""Dead letters: the headers that say where an event came from and why it was rejected, and
the reference the dead-letter topic gets for an event too large for it
(docs/concepts/join-rules.md).

The processor decides what is rejected; the emitter (:mod:`rl_export.stream.emitter`) sends
dead letters with these headers and reads them back after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_export.model.events import EventRejection
from rl_export.stream.processor import InMessage


def dead_letter_headers(message: InMessage, rejection: EventRejection) -> list[tuple[str, bytes]]:
    """Headers that say where a dead letter came from and why (the value is the original)."""
    return [
        ("rl-export-reason", rejection.reason.value.encode()),
        ("rl-export-detail", rejection.detail.encode()[:4096]),
        ("rl-export-source-topic", message.topic.encode()),
        ("rl-export-source-partition", str(message.partition).encode()),
        ("rl-export-source-offset", str(message.offset).encode()),
    ]


REFERENCE_HEAD_BYTES = 1024
"""How many of its first bytes a dead-letter reference keeps of an event (and of its key)."""
HEADER_REFERENCE = "rl-export-reference"
"""A dead-letter reference's header: the event's size in bytes; the value is its first bytes."""


def dead_letter_reference(
    message: InMessage, rejection: EventRejection, refused: str
) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """What the dead-letter topic gets for an event it refused whole (``refused``: the
    broker's error): the key and value's first bytes, the usual headers, and the size.

    The event itself stays in its input topic, at the source partition and offset the
    headers give, until that topic's retention removes it.
    """
    head = REFERENCE_HEAD_BYTES
    detail = (f"{rejection.detail}; the dead-letter topic refused the event ({refused}): "
              f"the value holds its first {head} of {len(message.value)} bytes")  # fmt: skip
    headers = dead_letter_headers(message, EventRejection(rejection.reason, detail))
    headers.append((HEADER_REFERENCE, str(len(message.value)).encode()))
    key = None if message.key is None else message.key[:head]
    return key, message.value[:head], headers


def dead_letter_source(headers: Sequence[tuple[str, bytes]]) -> tuple[str, int, int] | None:
    """Where a dead letter's event came from (topic, partition, offset), from its headers."""
    found = dict(headers)
    try:
        topic = found["rl-export-source-topic"].decode()
        partition = int(found["rl-export-source-partition"])
        return topic, partition, int(found["rl-export-source-offset"])
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
