"""Records read only as far as an export needs them (pure).

A trajectory record is about 4 KiB, and most exports look at a few of its fields: a filter
reads ``passed`` or ``reward``, a CSV its columns, ``messages`` copies the conversation
without looking into it. :class:`FieldDecoder` parses only the named top-level fields of
each line (msgspec skips the others without building them) and hands the ones named
``raw`` over as :class:`~rl_export.model.codec.RawJson`, their bytes as stored, which the
encoders copy verbatim (the stored bytes are what the encoder wrote: the same bytes come
out). A record is a dict of the fields it has among those named, so ``record.get(...)`` and
``key in record`` answer as on the whole record for those fields.

:func:`export_fields` says which fields an export reads: ``None`` when it needs the whole
record (default CSV columns, ``zip``), else ``(parsed, raw)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

import msgspec

from rl_export.export.columns import Column
from rl_export.formats.chat import HF, Chat
from rl_export.formats.filters import Filters
from rl_export.formats.render import TABULAR_FORMATS, row_fields
from rl_export.model.codec import RawJson

STATS_FIELDS = frozenset({"reward", "passed", "labels_count"})
"""What :class:`~rl_export.export.stats.StatsAccumulator` reads of a record."""


class DecodeError(ValueError):
    """A line that is not a JSON object."""


class FieldDecoder:
    """Decodes JSON Lines into dicts of the named top-level fields only: ``fields`` parsed,
    ``raw`` as :class:`~rl_export.model.codec.RawJson`."""

    def __init__(self, fields: Iterable[str], raw: Iterable[str] = ()) -> None:
        raw = frozenset(raw)
        names = sorted(set(fields) | raw)
        # A TypedDict: msgspec builds the dict of the fields present, skipping the rest.
        row = TypedDict(  # type: ignore[misc]
            "Row",
            {name: msgspec.Raw if name in raw else Any for name in names},
            total=False,
        )
        self.decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(row)
        self.raw = tuple(n for n in names if n in raw)

    def decode(self, data: bytes | memoryview) -> list[dict[str, Any]]:
        """The records of whole JSON Lines ``data`` (no empty lines), in order."""
        try:
            records: list[dict[str, Any]] = self.decoder.decode_lines(data)
            for name in self.raw:
                for record in records:
                    if name in record:
                        record[name] = RawJson(bytes(record[name]))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(str(exc)) from None
        return records


def export_fields(
    fmt: str,
    filters: Filters,
    columns: Sequence[Column] | None = None,
    pair_by: Sequence[str] = (),
    *,
    mask: bool = False,
    card: bool = False,
    chat: Chat = HF,
    template: bool = False,
) -> tuple[frozenset[str], frozenset[str]] | None:
    """``(parsed, raw)`` top-level fields an export of ``fmt`` reads (``raw``: copied as
    stored), or None when it reads whole records. ``mask``: turn masks (the messages and
    the evaluation parsed); ``card``: a dataset card (``rules_version`` read too);
    ``chat``: the chat style (one that changes the messages parses them); ``template``: rows
    made for a chat template (the trace's tools, in its metadata, and its id)."""
    wanted = filters.fields() | ({"rules_version"} if card else set())
    if fmt in TABULAR_FORMATS:
        if fmt == "zip" or columns is None:
            return None
        return wanted | {c.path[0] for c in columns}, frozenset()
    if fmt == "stats":
        return wanted | STATS_FIELDS, frozenset()
    found = row_fields(fmt, pair_by, mask=mask, chat=chat, tools=template)
    if found is None:
        return None
    parsed, raw = found
    if template:
        parsed = parsed | {"trace_id"}
    return wanted | parsed, raw - wanted - parsed
