"""Blind, redacted queue and claim items (docs/guides/security.md).

A labeler who sees how others rated a trace rates it like them, which inflates exactly the
agreement the report measures. So while the project's labeling setting ``blind`` is true (the
default), an item of ``GET queue`` or ``POST queue/claim`` carries none of what other
labelers left on the trace: the record fields of :data:`HUMAN_FIELDS` are null (unknown, not
"unlabeled": the record format's reading of a missing label field), and a human-sourced
record's reward and verdict too. Nor anything that counts or dates their work: the fields of
:data:`COUNTING_FIELDS` (``revision`` counts every event of the trace, labels and skips
included; ``updated_at`` is the time of the latest) are null too, so the items of two traces
that differ only in how many labels they have are the same bytes but for the trace's own
content. Whatever the setting, the item's free text is redacted with the project's default
kinds (``RL_EXPORT_REDACT``): a ``label`` token reads traces to rate them, not to copy their
secrets.

Every item carries a ``handle`` instead of a revision: an opaque digest of what the item
shows (after blinding and redaction), which changes when, and only when, the item does. A
client that wants to know whether the trace it shows has changed compares handles; blind, a
label somebody else adds does not change it.

Pure: a corpus line in, the item's JSON out (:func:`queue_item`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from rl_export.labeling.evaluations import hide_evaluations
from rl_export.privacy.kinds import Counts
from rl_export.privacy.redact import Redactor

HUMAN_FIELDS: tuple[str, ...] = (
    "human_labels",  # each label: labeler, ratings, comment
    "labels",  # the same, as record schema 2 named it
    "labelers",  # who labeled
    "skipped_by",  # who skipped
    "labels_count",  # how many labeled
    "rubric",  # the labelers' mean ratings
)
"""The trajectory record's fields that carry other labelers' names, ratings or comments."""

HUMAN_REWARD_FIELDS: tuple[str, ...] = ("reward", "passed")
"""Fields that are a human reward when the record's ``reward_source`` is ``human``."""

COUNTING_FIELDS: tuple[str, ...] = (
    "revision",  # the number of the trace's events: one more per label, skip or retraction
    "updated_at",  # the time of its latest event: a label's, once labeled
    "comparisons",  # other labelers' comparisons of the trace (section 12 of the design)
)
"""The record's fields that count, date or order other labelers' work on the trace."""

HANDLE = "handle"
"""The item's opaque handle (:func:`queue_item`)."""


def blind(record: dict[str, Any]) -> dict[str, Any]:
    """The record without any other labeler's label, nor anything that counts or dates
    them: :data:`HUMAN_FIELDS` and :data:`COUNTING_FIELDS` null (when present), and the
    reward and verdict of a human-sourced record null."""
    hidden = {name: None for name in (*HUMAN_FIELDS, *COUNTING_FIELDS) if name in record}
    if record.get("reward_source") == "human":
        hidden.update(dict.fromkeys(HUMAN_REWARD_FIELDS))
    return {**record, **hidden} if hidden else record


def handle(item: dict[str, Any]) -> str:
    """An opaque digest of what an item shows (its fields but the handle, in order)."""
    shown = {k: v for k, v in item.items() if k != HANDLE}
    return hashlib.sha256(orjson.dumps(shown)).hexdigest()[:32]


def queue_item(
    line: bytes, *, blinded: bool, scrub: Redactor | None, evaluations: bool = True
) -> tuple[bytes, Counts]:
    """A corpus line as a queue or claim item: blinded when asked, without the evaluators'
    verdict unless ``evaluations`` (:mod:`rl_export.labeling.evaluations`), redacted by
    ``scrub`` (None: the project redacts nothing), with its :func:`handle` last; with what
    was replaced, per kind."""
    record = orjson.loads(line)
    if not isinstance(record, dict):
        raise ValueError("a corpus line is not a JSON object")
    counts: Counts = {}
    if blinded:
        record = blind(record)
    if not evaluations:
        record = hide_evaluations(record)
    if scrub is not None:
        record, counts = scrub.record(record)
    record[HANDLE] = handle(record)
    return orjson.dumps(record), counts
