"""A dataset's rows (:func:`rl_export.hf.corpus_dataset`): the export's row options (format,
chat style, masks, redaction, filters, split, chat template) checked as the export checks
them and applied to a trajectory corpus's records with the export's own code: filters, split,
:func:`~rl_export.formats.render.render_row`, redaction of the row (the bytes ``rl-export
export`` writes for it), then, with a chat template, the row made for it
(:mod:`rl_export.formats.fit`: a row it cannot render is left out)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_export.export.requests import check_template
from rl_export.export.splits import Split, parse_split
from rl_export.formats.chat import HF, Chat, parse_chat
from rl_export.formats.filters import Filters
from rl_export.formats.fit import TemplateFit
from rl_export.formats.render import JSONL_FORMATS, MASK_FORMATS, render_row
from rl_export.formats.templates import load_template
from rl_export.formats.turns import TurnMask
from rl_export.model.errors import ExportError
from rl_export.privacy.kinds import RedactError, parse_kinds
from rl_export.privacy.redact import redactor
from rl_export.runtime.settings import load_settings

ROW_FORMATS = tuple(f for f in JSONL_FORMATS if f != "preference")
"""The formats ``corpus_dataset(format=...)`` renders a trajectory corpus's records in
(``preference`` pairs records across the corpus: it is an export)."""


@dataclass(frozen=True)
class RowOptions:
    """How a dataset renders the records of a trajectory corpus: the export's row options,
    applied with the export's own code (filters, split,
    :func:`~rl_export.formats.render.render_row`, then redaction of the row). The default
    is the rows as stored."""

    format: str = "trajectory"
    chat: Chat = HF
    mask: TurnMask | None = None
    redact: tuple[str, ...] = ()
    filters: Filters = field(default_factory=Filters)
    split: Split | None = None
    fit: TemplateFit | None = None  # rows made for a chat template (those it renders)

    @property
    def as_stored(self) -> bool:
        return self == RowOptions()

    def rows(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows of some live records (those without a row, or filtered out, left out)."""
        if self.as_stored:
            return records
        out = []
        for record in records:
            if "reward_source" not in record or "messages" not in record:
                raise ValueError(
                    "corpus_dataset's format, chat_style, redact, mask and filter options "
                    "render trajectory records: this corpus holds rows of another format "
                    f"(columns {sorted(record)})"
                )
            if not self.filters.matches(record):
                continue
            if self.split is not None and not self.split.matches(record):
                continue  # the export's order: filters, split, then redaction
            row = render_row(self.format, record, mask=self.mask, chat=self.chat,
                             tools=self.fit is not None)  # fmt: skip
            if row is not None and self.redact:  # redacted as the export redacts it
                row = redactor(self.redact).record(row)[0]
            if row is not None and self.fit is not None:
                row, _ = self.fit.row(self.format, row)
            if row is not None:
                out.append(row)
        return out


def row_options(
    fmt: str = "trajectory",
    *,
    chat_style: str | None = None,
    system: str | None = None,
    mask_failed_turns: bool = False,
    mask_types: Iterable[str] | None = None,
    redact: str | Iterable[str] | None = None,
    filters: Filters | None = None,
    split: str | None = None,
    splits: str | Mapping[str, float] | None = None,
    split_by: str | None = None,
    split_salt: str | None = None,
    chat_template: str | None = None,
) -> RowOptions:
    """The options checked as the export checks them (ValueError naming what is wrong).
    ``splits`` is the export's ``--splits`` text or a mapping ``{"train": 0.9, ...}``;
    ``chat_template`` a file or a name (``RL_EXPORT_CHAT_TEMPLATES``' or a built-in), probed
    here, once."""
    if fmt not in ROW_FORMATS:
        raise ValueError(f"unknown format {fmt!r} (corpus_dataset formats: "
                         f"{', '.join(ROW_FORMATS)})")  # fmt: skip
    if (mask_failed_turns or mask_types) and fmt not in MASK_FORMATS:
        raise ValueError(f"mask_failed_turns applies to {' and '.join(MASK_FORMATS)}, "
                         f"not {fmt!r}")  # fmt: skip
    if filters is not None and filters.limit is not None:
        raise ValueError("filters: limit does not apply to a dataset (use dataset.take(n))")
    mask = None
    if mask_failed_turns or mask_types:
        mask = TurnMask(frozenset(mask_types) if mask_types else None)
    try:
        kinds = parse_kinds(redact) if redact else ()
    except RedactError as e:
        raise ValueError(str(e)) from None
    if isinstance(splits, Mapping):
        splits = ",".join(f"{name}={share!r}" for name, share in splits.items())
    try:
        chosen = parse_split(split, splits, split_by, split_salt)
    except ExportError as e:
        keyword = e.setting.replace("-", "_")  # the keyword, not the export's flag
        detail = re.sub(r"--([a-z-]+)", lambda m: m[1].replace("-", "_") + "=", e.detail)
        raise ValueError(f"{keyword}: {detail}") from None
    chat = parse_chat(chat_style, system)
    fit = None
    if chat_template is not None:
        try:
            check_template(fmt, chat)
            loaded = load_template(chat_template, folder=load_settings().chat_templates)
        except ExportError as exc:
            raise ValueError(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None
        fit = TemplateFit.probed(loaded.template, merge_system=chat.system == "merge")
        chat = Chat("hf", chat.system, split=False)
    return RowOptions(fmt, chat, mask, kinds, filters or Filters(), chosen, fit)
