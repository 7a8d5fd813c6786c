"""Corpus specs: what a continuous export holds (its name, reward source, format and filter).

``RL_EXPORT_CORPORA`` is a JSON list of specs, e.g. a continuously refreshed chat-SFT corpus of
passed conversations is::

    {"name": "sft-passed", "source": "evaluator", "format": "messages", "filter": {"passed": true}}

``format`` is any JSON Lines format but ``preference`` (pairs need the whole latest view: an
export) and ``rl_prompts`` (verl's files: an export). A ``messages`` or
``prompt_completion`` corpus may weigh its assistant messages by turn (docs/guides/exports.md):
``"mask_failed_turns": true``, optionally ``"mask_types": ["goal_met", ...]``. A
``messages``, ``prompt_completion`` or ``kto`` corpus writes its messages in a chat style
(:mod:`rl_export.formats.chat`): ``"chat_style": "hf"`` (the default), ``"openai"`` or
``"raw"``, and ``"system": "merge"`` folds system messages into the first user message;
``"chat_template": "NAME"`` (or a file) makes every row for that template and leaves out the
rows it cannot render (:mod:`rl_export.formats.fit`; counted by the sink's metric
``rl_export_sink_template_left_out_total``).
``filter``
takes every filter of docs/guides/exports.md by name (``min-reward`` or ``min_reward``;
``limit`` aside, which a stream has no use for), JSON values or their text.
For backwards compatibility any other key that names a field of the trajectory record is the
old equality test (``{"rules_version": 1}``); anything else is an error naming the key.

Rows of a corpus in another format than ``trajectory`` lead with ``trace_id`` and
``revision`` (:func:`~rl_export.formats.render.corpus_row`), and its tombstones are the
trajectory tombstones: the latest view, compaction and ``shards verify`` work the same.

``redact`` (kinds, or ``pii``, ``all``, ``none``) writes the corpus already scrubbed
(:mod:`rl_export.privacy.redact`); a spec without it takes ``RL_EXPORT_REDACT`` (default
``secrets``): a corpus someone defines is one handed to a training team. The default corpora
(``human``, ``evaluator``, ``traces``) are what every export reads, so they stay verbatim
(redaction happens at the export, where ``--redact none`` can still give the data back): a
spec that names one of them with kinds to redact is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from rl_export.formats.chat import HF, Chat, ChatStyle, SystemMode
from rl_export.formats.filters import FILTER_NAMES, Filters, canonical_name, filters_from_json
from rl_export.formats.fit import TemplateFit
from rl_export.formats.render import CHAT_FORMATS, CORPUS_FORMATS, MASK_FORMATS, corpus_row
from rl_export.formats.templates import load_template
from rl_export.formats.turns import TurnMask, parse_mask_types
from rl_export.model.codec import dumps_line
from rl_export.model.errors import FilterError
from rl_export.model.pairs import COMPARISONS
from rl_export.model.records import TrajectoryRecord, render
from rl_export.model.snapshots import SnapshotLines
from rl_export.privacy.kinds import Counts, RedactError, parse_kinds
from rl_export.privacy.redact import redactor

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
"""Org, project, corpus and topic names become path segments in the store."""

_RECORD_FIELDS = frozenset(TrajectoryRecord.model_fields)


def check_name(kind: str, value: str) -> str:
    """Org, project, corpus and topic names become path segments: keep them safe."""
    if not SAFE_NAME.match(value):
        raise ValueError(f"{kind} {value!r} cannot name a folder (use letters, digits, . _ -)")
    return value


class _RecordView(Mapping[str, Any]):
    """``render(snapshot, source)`` as a read-only mapping, without rendering it (filters)."""

    __slots__ = ("_lines", "_source")

    def __init__(self, lines: SnapshotLines, source: str | None) -> None:
        self._lines = lines
        self._source = source

    def __getitem__(self, key: str) -> Any:
        if key not in _RECORD_FIELDS:
            raise KeyError(key)
        return self._lines.value(self._source, key)  # type: ignore[arg-type]

    def get(self, key: str, default: Any = None) -> Any:
        return self._lines.value(self._source, key) if key in _RECORD_FIELDS else default  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        return iter(TrajectoryRecord.model_fields)

    def __len__(self) -> int:
        return len(_RECORD_FIELDS)


class CorpusSpec(BaseModel):
    """One continuous export: its name, reward source, format and filter."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(pattern=SAFE_NAME.pattern)
    source: Literal["human", "evaluator", "comparisons"] | None
    format: str = "trajectory"
    filter: Filters = Field(default_factory=Filters)
    # The kinds this corpus redacts; None until settings give the default (RL_EXPORT_REDACT).
    redact: tuple[str, ...] | None = None
    mask_failed_turns: bool = False
    mask_types: tuple[str, ...] | None = None
    chat_style: ChatStyle | None = None  # the chat formats; None: hf
    system: SystemMode | None = None  # None: keep
    chat_template: str | None = None  # FILE or NAME: rows made for it (with_template)
    equals: dict[str, Any] = Field(default_factory=dict, exclude=True)
    # Derived (no filter at all); a plain field, not a private attribute: the sink reads it
    # for every snapshot and corpus, and pydantic serves private attributes through
    # __getattr__, several times slower than a field in the instance's __dict__.
    everything: bool = Field(default=True, exclude=True, repr=False)
    mask: TurnMask | None = Field(default=None, exclude=True, repr=False)
    chat: Chat = Field(default=HF, exclude=True, repr=False)
    fit: SkipJsonSchema[TemplateFit | None] = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _split_filter(cls, data: Any) -> Any:
        """``filter`` as JSON: the filters of docs/guides/exports.md, and the old equality
        tests on record fields (kept in ``equals``)."""
        if not isinstance(data, dict) or not isinstance(data.get("filter"), Mapping):
            return data
        data = dict(data)
        raw = data["filter"]
        known = {k: v for k, v in raw.items() if canonical_name(k) is not None}
        equals = {k: v for k, v in raw.items() if canonical_name(k) is None}
        for key in equals:
            if key not in _RECORD_FIELDS:
                raise ValueError(
                    f"filter {key!r} is neither a filter ({', '.join(FILTER_NAMES[:-1])}) "
                    f"nor a record field"
                )
        if any(canonical_name(k) == "limit" for k in known):
            raise ValueError("filter 'limit' does not apply to a corpus (it is an export's)")
        try:
            data["filter"] = filters_from_json(known)
        except FilterError as exc:
            raise ValueError(f"filter {exc}") from None
        data["equals"] = {**data.get("equals", {}), **equals}
        return data

    @field_validator("redact", mode="before")
    @classmethod
    def _parse_redact(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_kinds(value if value != [] else "none")
        except RedactError as exc:
            raise ValueError(f"redact: {exc.detail}") from None

    @model_validator(mode="after")
    def _check(self) -> CorpusSpec:
        if self.redact and self.name in SOURCE_CORPORA:
            raise ValueError(
                f"corpus {self.name!r} is what exports read: it stays verbatim (exports "
                f"redact as they write; --redact none gives the data back), so it takes no "
                f"redact"
            )
        if self.format not in CORPUS_FORMATS:
            hint = {
                "preference": " (pairs need the whole latest view: use rl-export export)",
                "rl_prompts": " (verl's files: use rl-export export)",
            }.get(self.format, "")
            raise ValueError(
                f"format {self.format!r} cannot be a corpus{hint}; corpus formats: "
                f"{', '.join(CORPUS_FORMATS)}"
            )
        object.__setattr__(self, "everything", self.filter.is_empty() and not self.equals)
        if self.source == COMPARISONS and (self.format != "trajectory" or not self.everything):
            raise ValueError("a corpus of source comparisons holds the pair records as they "
                             "are: no format but trajectory, no filter")  # fmt: skip
        if self.mask_types is not None:
            if not self.mask_failed_turns:
                raise ValueError("mask_types needs mask_failed_turns: true")
            try:
                types = parse_mask_types(self.mask_types)
            except ValueError as exc:
                raise ValueError(f"mask_types: {exc}") from None
            object.__setattr__(self, "mask_types", tuple(sorted(types or ())) or None)
        if self.mask_failed_turns:
            if self.format not in MASK_FORMATS:
                raise ValueError(
                    f"mask_failed_turns applies to the formats {', '.join(MASK_FORMATS)}, "
                    f"not {self.format!r}"
                )
            mask = TurnMask(frozenset(self.mask_types) if self.mask_types else None)
            object.__setattr__(self, "mask", mask)
        if self.chat_template is not None and self.chat_style not in (None, "hf"):
            raise ValueError("chat_template makes the messages the template needs (in the hf "
                             "chat style): give no chat_style")  # fmt: skip
        for key in ("chat_style", "system", "chat_template"):
            if getattr(self, key) is not None and self.format not in CHAT_FORMATS:
                raise ValueError(
                    f"{key} applies to the formats {', '.join(CHAT_FORMATS)}, not {self.format!r}"
                )
        object.__setattr__(self, "chat", Chat(self.chat_style or "hf", self.system or "keep"))
        return self

    def with_template(self, folder: Path | None) -> CorpusSpec:
        """This spec with its ``chat_template`` loaded (a file, a name in ``folder`` or a
        built-in) and probed, once: its rows are then made for it, and those it cannot render
        are not in the corpus. ExportError for a template that cannot be loaded."""
        if self.chat_template is None or self.fit is not None:
            return self
        loaded = load_template(self.chat_template, folder=folder)
        fit = TemplateFit.probed(loaded.template, merge_system=self.system == "merge")
        chat = Chat("hf", self.system or "keep", split=False)
        return self.model_copy(update={"fit": fit, "chat": chat})

    def with_redact_default(self, kinds: tuple[str, ...]) -> CorpusSpec:
        """This spec, with ``kinds`` as its ``redact`` if it names none (the default corpora
        none at all)."""
        if self.redact is not None:
            return self
        default = () if self.name in SOURCE_CORPORA else kinds
        return self.model_copy(update={"redact": default})

    def scrub(self, line: bytes) -> tuple[bytes, Counts]:
        """A line of this corpus, redacted as its ``redact`` asks (the line itself, and no
        counts, when it asks for nothing)."""
        if not self.redact:
            return line, {}
        new_line, _, counts = redactor(self.redact).line(line)
        return new_line, counts

    @field_serializer("filter")
    def _dump_filter(self, value: Filters) -> dict[str, Any]:
        """The filter as it is written in ``RL_EXPORT_CORPORA`` (read back the same)."""
        return {**value.to_params(sep="-"), **self.equals}

    def matches(self, record: Mapping[str, Any]) -> bool:
        """True when the record passes the filter (and every old equality test)."""
        if self.everything:
            return True
        return self.filter.matches(record) and all(
            record.get(k) == v for k, v in self.equals.items()
        )

    def record_for(self, snapshot: dict[str, Any]) -> dict[str, Any] | None:
        """The row this corpus holds for a snapshot: a row, a tombstone, or None.

        None means "not in this corpus" (not ready for the source, filtered out, or no row
        in this format); the writer turns that into a tombstone when the corpus holds the
        trace.
        """
        record = render(snapshot, self.source)
        if record is None or record.get("deleted"):
            return record
        if not self.matches(record):
            return None
        return self._row(record)[0]

    def _row(self, record: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """The corpus's row of a live record that matches (None: no row), and, with a chat
        template, why it has none."""
        row = corpus_row(self.format, record, mask=self.mask, chat=self.chat,
                         tools=self.fit is not None)  # fmt: skip
        if row is None or self.fit is None:
            return row, None
        return self.fit.row(self.format, row)

    def holds(self, snapshot: SnapshotLines) -> bool:
        """True when the record is ready and passes the filter (the format aside).

        The sink's way to the same answer without rendering the record as a dict.
        """
        source = self.source
        if not snapshot.ready(source):
            return False
        return self.everything or self.matches(_RecordView(snapshot, source))

    def line(self, snapshot: SnapshotLines) -> bytes | None:
        """The JSON Lines line of :meth:`record_for` when it is a row, else None.

        ``trajectory`` lines come from :meth:`SnapshotLines.line` (encoded once per
        snapshot, byte for byte ``dumps_line(record)``); other formats render the record.
        """
        return self.held_line(snapshot) if self.holds(snapshot) else None

    def held_line(
        self, snapshot: SnapshotLines, left_out: Callable[[str], None] | None = None
    ) -> bytes | None:
        """:meth:`line` of a snapshot this corpus :meth:`holds`; ``left_out`` is told why a
        chat template leaves its row out."""
        if self.format == "trajectory":
            return snapshot.line(self.source)
        record = render(snapshot.snapshot, self.source)
        if record is None:
            return None
        row, reason = self._row(record)
        if reason is not None and left_out is not None:
            left_out(reason)
        return None if row is None else dumps_line(row)


SOURCE_CORPORA = ("human", "evaluator", "traces", COMPARISONS)
"""The default corpora: what exports read (by reward source) and new corpora are seeded from."""

DEFAULT_CORPORA: tuple[CorpusSpec, ...] = (
    CorpusSpec(name="human", source="human", redact=()),
    CorpusSpec(name="evaluator", source="evaluator", redact=()),
    CorpusSpec(name="traces", source=None, redact=()),
    CorpusSpec(name=COMPARISONS, source=COMPARISONS, redact=()),
)
