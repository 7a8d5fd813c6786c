"""Splits that stay put as a corpus grows (docs/guides/exports.md, ``--split``; pure).

``--split NAME --splits train=0.9,eval=0.05,test=0.05 [--split-by FIELD] [--split-salt S]``
keeps the rows of one split. A row's split is decided by a stable hash of (salt, the row's
FIELD value) alone: the first 8 bytes of ``sha256(salt + "\\0" + value)`` as a fraction of
2^64 fall in one split's share of [0, 1), the splits laid out in the order given. Nothing
else enters it (not the corpus, not the other rows, not the time), so a trace never changes
split as the corpus grows, and all rows that share a FIELD value share a split (split by
``scenario`` for held-out scenarios).

FIELD is ``trace_id`` (the default), any top-level record field (``scenario``,
``agent_version``, ...) or ``metadata.KEY`` (a key of the trace's metadata). The value is
compared as text: a string as it is, anything else as its compact JSON (``null`` when the
field or key is absent).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_export.export.columns import RECORD_FIELDS
from rl_export.formats.filters import metadata_text
from rl_export.model.errors import ExportError

_TOLERANCE = 1e-9  # how far from 1 the fractions' sum may be (decimal fractions in binary)


@dataclass(frozen=True)
class Split:
    """What ``--split`` asks for: the split kept, every split's share, the field, the salt."""

    name: str
    splits: tuple[tuple[str, float], ...]
    by: str = "trace_id"
    salt: str = ""

    @property
    def field(self) -> str:
        """The top-level record field the split reads."""
        return self.by.split(".", 1)[0]

    def of(self, record: Mapping[str, Any]) -> str:
        """The split a record belongs to."""
        return self.of_value(split_value(record, self.by))

    def of_value(self, value: str) -> str:
        """The split of the rows whose ``by`` value is ``value`` (its text)."""
        point = split_point(self.salt, value)
        edge = 0.0
        for name, share in self.splits[:-1]:
            edge += share
            if point < edge:
                return name
        return self.splits[-1][0]

    def matches(self, record: Mapping[str, Any]) -> bool:
        """True when the record belongs to the split kept."""
        return self.of(record) == self.name

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "splits": dict(self.splits), "by": self.by, "salt": self.salt}


def split_value(record: Mapping[str, Any], by: str) -> str:
    """The text of a record's ``by`` value (``metadata.KEY``: a metadata key)."""
    if by.startswith("metadata."):
        metadata = record.get("metadata")
        key = by.split(".", 1)[1]
        value = metadata.get(key) if isinstance(metadata, Mapping) else None
    else:
        value = record.get(by)
    return metadata_text(value)


def split_point(salt: str, value: str) -> float:
    """Where (salt, value) falls in [0, 1)."""
    digest = hashlib.sha256(salt.encode() + b"\0" + value.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def parse_splits(text: str) -> tuple[tuple[str, float], ...]:
    """``train=0.9,eval=0.05,test=0.05`` -> the splits in order; ExportError naming
    ``splits`` unless every name is given once with a share in (0, 1] and the shares sum
    to 1."""
    out: list[tuple[str, float]] = []
    for item in text.split(","):
        name, equals, share = item.strip().partition("=")
        name = name.strip()
        if not equals or not name:
            raise ExportError("splits", f"expected NAME=FRACTION,... (e.g. train=0.9,eval=0.1), "
                              f"got {item.strip()!r}")  # fmt: skip
        try:
            value = float(share)
        except ValueError:
            raise ExportError("splits", f"{name}: {share.strip()!r} is not a number") from None
        if not math.isfinite(value) or not 0 < value <= 1:
            raise ExportError("splits", f"{name}: {share.strip()} is not a fraction in (0, 1]")
        if name in dict(out):
            raise ExportError("splits", f"{name} is given twice")
        out.append((name, value))
    total = math.fsum(v for _, v in out)
    if abs(total - 1) > _TOLERANCE:
        raise ExportError("splits", f"the fractions sum to {total:g}, not 1")
    return tuple(out)


def parse_split(
    name: str | None,
    splits: str | None = None,
    by: str | None = None,
    salt: str | None = None,
) -> Split | None:
    """``--split``, ``--splits``, ``--split-by`` and ``--split-salt`` -> :class:`Split` (None:
    no split); ExportError naming the flag for a bad value or a flag without ``--split``."""
    if name is None:
        for flag, value in (("splits", splits), ("split-by", by), ("split-salt", salt)):
            if value is not None:
                raise ExportError(flag, "only applies with --split NAME")
        return None
    if splits is None:
        raise ExportError("splits", "--split needs --splits, e.g. train=0.9,eval=0.05,test=0.05")
    parsed = parse_splits(splits)
    if name not in dict(parsed):
        raise ExportError(
            "split", f"{name!r} is not one of --splits ({', '.join(n for n, _ in parsed)})"
        )
    field = by if by is not None else "trace_id"
    if field.startswith("metadata."):
        if not field[len("metadata.") :]:
            raise ExportError("split-by", "metadata. needs a key, e.g. metadata.customer")
    elif field not in RECORD_FIELDS:
        raise ExportError(
            "split-by",
            f"no record field {field!r} (e.g. trace_id, scenario, agent_version, metadata.KEY)",
        )
    return Split(name, parsed, field, salt or "")
