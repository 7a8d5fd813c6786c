"""Reading a corpus's latest view for an export: parsed or partly parsed, filtered, counted.

Every export and ``stats`` reads the view through a :class:`Scan`, which fills in an
:class:`ExportSummary` and reports progress as it goes; :mod:`rl_export.export.exports`
renders what it yields, :mod:`rl_export.export.pairs` pairs it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from rl_export.corpora.commits import ChainError, block_lines
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.latest import LatestView, ViewPosition
from rl_export.export.lazy import DecodeError, FieldDecoder
from rl_export.export.prefilter import sidecar_part
from rl_export.formats.filters import Filters
from rl_export.model.codec import RawJson, dumps
from rl_export.model.records import LEGACY_KEY_RE, upgrade_lines
from rl_export.privacy.kinds import add_counts
from rl_export.privacy.redact import Redactor

Progress = Callable[[int, int | None], None]
"""``progress(done, total)``: latest records read, and how many there are once known."""


@dataclass
class ExportSummary:
    """What an export wrote."""

    format: str = ""
    records: int = 0  # rows written (pairs, for preference)
    scanned: int = 0  # latest records read
    matched: int = 0  # records that passed the filters
    skipped: int = 0  # matched records with no row in the format
    bytes: int = 0
    attachments: int = 0
    attachment_errors: int = 0
    # Substrings replaced per kind (every kind asked for, 0 when none was found).
    redactions: dict[str, int] = field(default_factory=dict)
    turns_outside: int = 0  # failing outcomes whose turn the conversation lacks (masks)
    duplicates_removed: int = 0  # --dedup: matched rows of the split left out as duplicates
    split_left_out: int = 0  # --split: rows that passed the filters but are of another split
    position: dict[str, Any] | None = None  # the view's position read (lineage)
    # A read at a past position: records of traces deleted since, left out (deletion wins).
    erased: int = 0
    sha256: str | None = None  # of the bytes written to a file (lineage)
    rules_versions: set[int] = field(default_factory=set)  # of the records read (cards)
    # --chat-template: the template, what every row got, and the rows left out by reason.
    template: dict[str, Any] | None = None
    adaptations: list[str] = field(default_factory=list)
    unrenderable: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rules_versions"] = sorted(self.rules_versions)
        return out

    def why_empty(self) -> str | None:
        """Why the export wrote no row, and what to try (None when it wrote some)."""
        if self.records:
            return None
        if not self.scanned:
            return "the corpus holds no live record yet"
        if not self.matched:
            return f"none of the {self.scanned} latest records matches the filters"
        if self.format == "preference":
            if self.skipped >= self.matched:
                return (f"none of the {self.matched} matching records can pair (a pair needs "
                        f"a reward, a user message and a reply to it)")  # fmt: skip
            return (
                f"no two of the {self.matched - self.skipped} matching trajectories share a "
                f"prompt (the messages up to the first user message, compared exactly) with "
                f"different rewards; pairs need several runs of the same prompt: try "
                f"--pair-by with fewer fields, a smaller --margin, or other filters"
            )
        if self.skipped >= self.matched:
            need = _ROW_NEEDS.get(self.format, "what the format needs")
            return f"none of the {self.matched} matching records has a {self.format} row ({need})"
        if self.unrenderable:
            left = sum(self.unrenderable.values())
            return (f"the chat template left out all {left} rows it was given (see why in "
                    "the summary): try another template of the model's family")  # fmt: skip
        return None


_ROW_NEEDS = {
    "prompt_completion": "a user message and something after the last one",
    "kto": "a user message, something after the last one, and a passed verdict, which the "
    "traces source lacks",
    "rl_prompts": "a user message",
}


class Scan:
    """Reads the view, parses, filters; counts into the summary; calls progress.

    With ``fields`` (``(parsed, raw)``, :func:`~rl_export.export.lazy.export_fields`) only
    those top-level fields of each record are read (:class:`~rl_export.export.lazy.
    FieldDecoder`); else each line is parsed in full. ``with_lines`` also gives each
    record's line (else an empty ``bytes``). ``collect_rules`` notes the ``rules_version``
    of every record that passes (it must be among ``fields``) in the summary. ``redactor`` is
    what :meth:`redact` and :meth:`redact_block` apply to what an export writes (after its
    limit). ``select`` (a split, the rows a dedup keeps) is asked of every record that passed
    the filters (it must read only ``fields``); the records it turns down are not
    yielded."""

    def __init__(
        self,
        view: LatestView,
        filters: Filters,
        summary: ExportSummary,
        progress: Progress | None,
        fields: tuple[frozenset[str], frozenset[str]] | None = None,
        *,
        with_lines: bool = False,
        redactor: Redactor | None = None,
        collect_rules: bool = False,
        select: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.view = view
        self.filters = filters
        self.summary = summary
        self.progress = progress
        self.fields = fields
        self.with_lines = with_lines
        self.collect_rules = collect_rules
        self.select = select
        self.decoder = None if fields is None else FieldDecoder(*fields)
        # What a line's index sidecar can tell of the filters: the lines it turns down are
        # not parsed (the rest are filtered in full, so the result is the same).
        self.prefilter = sidecar_part(filters)
        self.redactor = redactor if redactor else None
        if self.redactor is not None:
            summary.redactions = dict.fromkeys(self.redactor.kinds, 0)

    def redact(
        self, pairs: list[tuple[bytes, dict[str, Any]]]
    ) -> list[tuple[bytes, dict[str, Any]]]:
        """(line, record) pairs with their free text redacted, counted in the summary. With
        lines (the ``trajectory`` format) a line no gate opens for is not parsed; a record
        read in part is redacted in the fields it holds (all its row is made of)."""
        redactor = self.redactor
        if redactor is None:
            return pairs
        total = self.summary.redactions
        out = []
        for line, record in pairs:
            if self.with_lines:
                new_line, full, counts = redactor.line(line)
                new = record if full is None else _project(full, record)
            else:
                new_line = line
                new, counts = redactor.record(record)
            if counts:
                add_counts(total, counts)
            out.append((new_line, new))
        return out

    def redact_block(self, block: bytes | memoryview) -> bytes | memoryview:
        """A block of whole JSON Lines lines, redacted: only the lines a gate opens for are
        parsed (the block itself when nothing changed)."""
        redactor = self.redactor
        if redactor is None:
            return block
        data = bytes(block)
        hit = redactor.next_hit(data)
        if hit < 0:
            return block
        total = self.summary.redactions
        out: list[bytes] = []
        pos = 0
        while hit >= 0:
            start = data.rfind(b"\n", pos, hit) + 1 or pos
            end = data.find(b"\n", hit) + 1 or len(data)
            new_line, _, counts = redactor.line(data[start:end])
            if counts:
                add_counts(total, counts)
            out += [data[pos:start], new_line]
            pos = end
            hit = redactor.next_hit(data, pos)
        out.append(data[pos:])
        return b"".join(out)

    def _advance(self, count: int) -> None:
        self.summary.scanned += count
        if self.progress is not None:
            self.progress(self.summary.scanned, self.view.total)

    async def lines(
        self, *, with_lines: bool | None = None
    ) -> AsyncIterator[list[tuple[bytes, dict[str, Any]]]]:
        """Batches of (line, record) that passed the filters (``with_lines``: the lines
        given whatever the scan was made with)."""
        if self.decoder is not None:
            lines = self.with_lines if with_lines is None else with_lines
            async for decoded in self._decoded(self.decoder, lines):
                yield decoded
            return
        matches = self._matcher()
        async for data, start, end, passed_over in self._ranges():
            batch = block_lines((data, start, end))
            out = []
            for line in batch:
                record = orjson.loads(line)
                if matches(record):
                    out.append((line, record))
            self._matched(out)
            self._advance(len(batch) + passed_over)
            if out:
                yield out

    async def _decoded(
        self, decoder: FieldDecoder, with_lines: bool
    ) -> AsyncIterator[list[tuple[bytes, dict[str, Any]]]]:
        matches = self._matcher()
        async for data, start, end, passed_over in self._ranges():
            if end <= start:
                self._advance(passed_over)
                continue
            try:
                records = decoder.decode(memoryview(data)[start:end])
            except DecodeError as exc:
                raise ChainError(f"{self.view.ref.root}: a line is not a record ({exc})") from None
            if with_lines:
                starts = line_starts(data, start, end)
                if len(starts) != len(records):
                    raise ChainError(f"{self.view.ref.root}: an empty line in the corpus")
                starts.append(end)
                out = [
                    (data[starts[n] : starts[n + 1]], record)
                    for n, record in enumerate(records)
                    if matches(record)
                ]
            else:
                out = [(b"", record) for record in records if matches(record)]
            self._matched(out)
            self._advance(len(records) + passed_over)
            if out:
                yield out

    def _matcher(self) -> Callable[[dict[str, Any]], bool]:
        """The filters, then ``select``."""
        matches, select = self.filters.matches, self.select
        if select is None:
            return matches
        return lambda record: matches(record) and select(record)

    def _matched(self, out: list[tuple[bytes, dict[str, Any]]]) -> None:
        self.summary.matched += len(out)
        if self.collect_rules:
            versions = self.summary.rules_versions
            for _, record in out:
                version = record.get("rules_version")
                if isinstance(version, int):
                    versions.add(version)

    async def raw(self) -> AsyncIterator[tuple[memoryview, int]]:
        """Blocks of whole lines and their counts, unparsed: only when no filter is set
        (record schema 2's lines upgraded: :func:`~rl_export.model.records.upgrade_lines`)."""
        async for block, count in self.view.blocks():
            if count:
                self.summary.matched += count
                self._advance(count)
            upgraded = upgrade_lines(block)
            yield upgraded if isinstance(upgraded, memoryview) else memoryview(upgraded), count

    async def _ranges(self) -> AsyncIterator[tuple[Any, int, int, int]]:
        """The view's ranges of lines, record schema 2's lines upgraded to schema 3 (a range
        without the old key is passed on as it is)."""
        async for data, start, end, passed_over in self.view.ranges(self.prefilter):
            if end > start and LEGACY_KEY_RE.search(data, start, end) is not None:
                upgraded = bytes(upgrade_lines(bytes(data[start:end])))
                yield upgraded, 0, len(upgraded), passed_over
            else:
                yield data, start, end, passed_over


def _project(full: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """The fields ``record`` (maybe read in part) holds, from the whole redacted record."""
    return {
        k: RawJson(dumps(full[k])) if isinstance(v, RawJson) else full[k] for k, v in record.items()
    }


def line_starts(data: bytes, start: int, end: int) -> list[int]:
    find = data.find
    starts = []
    while start < end:
        starts.append(start)
        start = find(b"\n", start, end) + 1
    return starts


def limited(rows: list[Any], summary: ExportSummary, limit: int | None) -> list[Any]:
    if limit is not None and summary.records + len(rows) > limit:
        rows = rows[: max(limit - summary.records, 0)]
    summary.records += len(rows)
    return rows


async def open_view(
    store: ObjectStore, ref: CorpusRef, progress: Progress | None, at: ViewPosition | None = None
) -> LatestView:
    """The corpus's latest view (at ``at``: the view of that position, as it was)."""
    view = await LatestView(store, ref, at=at).open()
    if progress is not None:
        progress(0, view.total)
    return view
