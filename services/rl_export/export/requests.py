"""What an export asks for, checked before any byte is read: the reward source's corpus,
the format and its parameters, the file a format's rows go to, and the download's name and
content type. Every problem is an :class:`~rl_export.model.errors.ExportError` naming the
parameter (the CLI's flag, the API's query parameter).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Literal, cast

from rl_export.corpora.layout import CorpusRef
from rl_export.export.columns import RECORD_FIELDS, Column, parse_columns
from rl_export.export.templated import ON_UNRENDERABLE, OnUnrenderable
from rl_export.formats.chat import HF, Chat, parse_chat
from rl_export.formats.render import (
    CHAT_FORMATS,
    COMPLETIONS,
    JSONL_FORMATS,
    MASK_FORMATS,
    PAIR_FORMATS,
    TABULAR_FORMATS,
    Completion,
)
from rl_export.formats.specs import check_name
from rl_export.formats.turns import TurnMask, parse_mask_types
from rl_export.model.errors import ExportError
from rl_export.privacy.kinds import parse_kinds

SOURCES: tuple[str, ...] = ("human", "evaluator", "traces", "comparisons")
ZipData = Literal["csv", "json"]

_CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "parquet": "application/vnd.apache.parquet",
    "zip": "application/zip",
}
_EXTENSIONS = {"csv": ".csv", "json": ".json", "parquet": ".parquet", "zip": ".zip"}


def source_ref(org: str, project: str, source: str) -> CorpusRef:
    """The corpus of a reward source (``human``, ``evaluator``, ``traces``, ``comparisons``)."""
    if source not in SOURCES:
        raise ExportError("source", f"unknown source {source!r} (sources: {', '.join(SOURCES)})")
    try:
        return CorpusRef(check_name("org", org), check_name("project", project), source)
    except ValueError as exc:
        raise ExportError("org/project", str(exc)) from None


FILES: tuple[str, ...] = ("jsonl", "parquet")
"""How a JSON Lines format's rows may be encoded: JSON Lines, or Parquet (``rl_prompts``)."""


def content_type(fmt: str, file: str = "jsonl") -> str:
    """The HTTP content type of a format's file."""
    if file == "parquet":
        return _CONTENT_TYPES["parquet"]
    jsonl = fmt in JSONL_FORMATS or fmt in PAIR_FORMATS
    return "application/x-ndjson" if jsonl else _CONTENT_TYPES[fmt]


def file_name(ref: CorpusRef, fmt: str, file: str = "jsonl") -> str:
    """A file name for a download: ``<org>-<project>-<source>-<format>.<ext>``."""
    if file == "parquet":
        extension = ".parquet"
    else:
        extension = ".jsonl" if fmt in JSONL_FORMATS or fmt in PAIR_FORMATS else _EXTENSIONS[fmt]
    return f"{ref.org}-{ref.project}-{ref.corpus}-{fmt}{extension}"


PARQUET_FORMATS: tuple[str, ...] = ("rl_prompts", "messages")
"""The JSON Lines formats that also go to Parquet: verl's RL prompts and multi-turn SFT."""


def file_for(fmt: str, path: str | os.PathLike[str] | None) -> str:
    """How the rows of ``fmt`` go to the output ``path``: Parquet for ``rl_prompts`` and
    ``messages`` into a file whose name ends in ``.parquet`` (verl reads those), else JSON
    Lines."""
    if fmt in PARQUET_FORMATS and path is not None and str(path).endswith(".parquet"):
        return "parquet"
    return "jsonl"


def check_template(fmt: str, chat: Chat) -> None:
    """``--chat-template`` applies to the chat formats, whose messages it shapes itself (in
    the ``hf`` style): ExportError naming the flag otherwise."""
    if fmt not in CHAT_FORMATS:
        raise ExportError("chat-template", f"only applies to --format {', '.join(CHAT_FORMATS)}, "
                          f"not {fmt}")  # fmt: skip
    if chat.style != "hf":
        raise ExportError("chat-template", "makes the messages the template needs (in the hf "
                          f"chat style): give no --chat-style {chat.style}")  # fmt: skip


def parse_on_unrenderable(text: str | None, template: bool) -> OnUnrenderable:
    """``--on-unrenderable skip|fail`` (None: ``skip``); ExportError otherwise, or without a
    chat template."""
    if text is None:
        return "skip"
    if not template:
        raise ExportError("on-unrenderable", "only applies with --chat-template")
    if text not in ON_UNRENDERABLE:
        raise ExportError("on-unrenderable", f"{text!r} is not skip or fail")
    return cast(OnUnrenderable, text)


def parse_mask(
    fmt: str, mask_failed_turns: bool, mask_types: str | Sequence[str] | None = None
) -> TurnMask | None:
    """``--mask-failed-turns`` and ``--mask-types`` -> the turn mask (None: no mask);
    ExportError naming the flag when they do not apply."""
    if mask_types is not None and not mask_failed_turns:
        raise ExportError("mask-types", "only applies with --mask-failed-turns")
    if not mask_failed_turns:
        return None
    if fmt not in MASK_FORMATS:
        raise ExportError(
            "mask-failed-turns",
            f"only applies to --format {' or '.join(MASK_FORMATS)}, not {fmt}",
        )
    try:
        return TurnMask(parse_mask_types(mask_types))
    except ValueError as exc:
        raise ExportError("mask-types", str(exc)) from None


def parse_chat_style(fmt: str, style: str | None, system: str | None = None) -> Chat:
    """``--chat-style`` and ``--system`` -> the chat style (None: the default, ``hf`` and
    ``keep``); ExportError naming the flag when a value is unknown or the format has no
    chat messages."""
    try:
        chat = parse_chat(style, None)
    except ValueError as exc:
        raise ExportError("chat-style", str(exc)) from None
    try:
        chat = parse_chat(chat.style, system)
    except ValueError as exc:
        raise ExportError("system", str(exc)) from None
    if fmt not in CHAT_FORMATS:
        for flag, given in (("chat-style", style), ("system", system)):
            if given is not None:
                raise ExportError(
                    flag, f"only applies to --format {', '.join(CHAT_FORMATS)}, not {fmt}"
                )
    return chat


def parse_completion(fmt: str, text: str | None) -> Completion:
    """``preference --completion turn|rest`` (None: ``turn``); ExportError otherwise."""
    if text is None:
        return "turn"
    if fmt != "preference":
        raise ExportError("completion", "only applies to --format preference")
    if text in COMPLETIONS:
        return cast(Completion, text)
    raise ExportError("completion", f"{text!r} is not {' or '.join(COMPLETIONS)}")


def parse_pair_by(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``scenario,agent_version`` -> record fields to pair within; ExportError if unknown."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    fields = tuple(i.strip() for i in items if i.strip())
    for field in fields:
        if field not in RECORD_FIELDS:
            raise ExportError(
                "pair-by", f"no record field {field!r} (e.g. scenario, agent_version)"
            )
    return fields


def parse_margin(text: str | float | None) -> float:
    """A reward gap >= 0 (``0.2``); ExportError otherwise."""
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ExportError("margin", f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ExportError("margin", f"{text!r} is not a reward gap between 0 and 1")
    return value


def check_export(
    fmt: str,
    *,
    columns: str | Sequence[str] | None = None,
    pair_by: Sequence[str] = (),
    margin: float = 0.0,
    max_pairs: int = 1,
    zip_data: str = "csv",
    mask: TurnMask | None = None,
    file: str = "jsonl",
    card: bool = False,
    redact: str | Sequence[str] | None = None,
    chat: Chat = HF,
    completion: str = "turn",
    template: bool = False,
) -> list[Column] | None:
    """Check an export's parameters; return its columns (None for JSON Lines formats).
    ``template``: the rows are made for a chat template (``--chat-template``)."""
    parse_kinds(redact)
    if chat != HF and fmt not in CHAT_FORMATS:
        raise ExportError("chat-style", f"only applies to --format {', '.join(CHAT_FORMATS)}")
    if template:
        check_template(fmt, chat)
    if completion != "turn":
        parse_completion(fmt, completion)
    if fmt not in JSONL_FORMATS and fmt not in TABULAR_FORMATS and fmt not in PAIR_FORMATS:
        raise ExportError(
            "format",
            f"unknown format {fmt!r} (formats: {', '.join(JSONL_FORMATS + TABULAR_FORMATS)})",
        )
    if mask is not None and fmt not in MASK_FORMATS:
        raise ExportError(
            "mask-failed-turns", f"only applies to --format {' or '.join(MASK_FORMATS)}"
        )
    if file not in FILES:
        raise ExportError("file", f"{file!r} is not jsonl or parquet")
    if file == "parquet" and fmt not in PARQUET_FORMATS:
        raise ExportError("file", "parquet files are for rl_prompts and messages (verl's), and "
                          f"--format parquet, not {fmt}")  # fmt: skip
    if file == "parquet" and mask is not None:
        raise ExportError("mask-failed-turns", "verl's Parquet messages have no weight: write "
                          "the masked rows as JSON Lines")  # fmt: skip
    if card and fmt in ("csv", "json"):
        raise ExportError("card", "a dataset card goes with JSON Lines, Parquet or zip exports")
    if fmt != "preference":
        if pair_by:
            raise ExportError("pair-by", "only applies to --format preference")
        if margin:
            raise ExportError("margin", "only applies to --format preference")
        if max_pairs != 1:
            raise ExportError("max-pairs", "only applies to --format preference")
    parse_pair_by(pair_by)
    parse_margin(margin)
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1:
        raise ExportError("max-pairs", f"{max_pairs!r} is not an integer >= 1")
    if zip_data not in ("csv", "json"):
        raise ExportError("zip-data", f"{zip_data!r} is not csv or json")
    if fmt in TABULAR_FORMATS:
        return parse_columns(columns)
    if columns:
        raise ExportError("columns", f"only applies to {', '.join(TABULAR_FORMATS)}")
    return None
