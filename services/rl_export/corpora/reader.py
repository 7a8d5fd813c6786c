"""The reader trainers use: stream a corpus, resume from a cursor, follow new commits.

How a read travels (docs/concepts/corpora.md; the steps match :meth:`CorpusReader._walk`, which
both :meth:`CorpusReader.records` and :meth:`CorpusReader.follow_objects` read through):

1. Without a cursor, start from the latest compaction: yield its records (checksums and
   count verified); its ``positions`` then become the cursor.
2. List the corpus's chains (``<root>/_manifest/<topic>-<partition>/``), in topic then
   numeric partition order.
3. Per chain, follow the commits from the cursor's position (``from_offset`` ->
   ``last_offset + 1``), verify each shard (sha256 and record count) before yielding any of
   its records, and yield them in chain order.
4. The cursor moves with every record handed out, so a saved cursor resumes with neither a
   repeat nor a gap. A chain that does not continue at the cursor's position while later
   commits exist (a gap, a cursor from another corpus, history already expired) raises
   :class:`~rl_export.corpora.commits.ChainError` instead of silently skipping records.

The cursor is ``{"<topic>-<partition>": next from_offset}``. Between two shards that is all
it holds. While a shard is only partly handed out it also holds ``"<stream>/skip": n`` (the
first ``n`` records of the commit at that position were yielded), and while the starting
compaction is only partly handed out it is ``{"_compacted/generation": g,
"_compacted/skip": n}``. Stream names cannot contain ``/`` nor start with ``_``
(:func:`rl_export.corpora.layout.check_name`), so these keys never collide with a stream.

No adapters for torch or datasets live here: a trainer wraps :meth:`CorpusReader.records`
in the few lines its framework wants, and this module stays free of heavy imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from rl_export.corpora.commits import (
    ChainError,
    Commit,
    Part,
    block_lines,
    chain_keys,
    commit_part,
    object_blocks,
    read_commit,
)
from rl_export.corpora.compacted import Compaction, compaction_part, latest_compaction
from rl_export.corpora.erasures import erased_traces
from rl_export.corpora.layout import CorpusRef, parse_stream
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.versions import Version, check_chain_end
from rl_export.model.codec import dumps, iter_lines, loads
from rl_export.model.errors import ObjectNotFoundError
from rl_export.model.records import upgrade_record

log = logging.getLogger(__name__)

Cursor = dict[str, int]

SKIP_SUFFIX = "/skip"
CURSOR_GENERATION = "_compacted/generation"
CURSOR_GENERATION_SKIP = "_compacted/skip"


# --- cursors --------------------------------------------------------------------------------


def check_cursor(value: Any) -> Cursor:
    """Return ``value`` as a cursor (a copy); raise ValueError if it is not one."""
    if not isinstance(value, dict):
        raise ValueError(f"a cursor is a JSON object of stream -> offset, got {value!r}")
    out: Cursor = {}
    for key, offset in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"cursor key {key!r} is not a stream name")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"cursor[{key!r}] = {offset!r} is not an offset (integer >= 0)")
        out[key] = offset
    if (CURSOR_GENERATION_SKIP in out) != (CURSOR_GENERATION in out):
        raise ValueError(f"{CURSOR_GENERATION!r} and {CURSOR_GENERATION_SKIP!r} go together")
    for key in out:
        if key.endswith(SKIP_SUFFIX) and key != CURSOR_GENERATION_SKIP:
            stream = key.removesuffix(SKIP_SUFFIX)
            if stream not in out:
                raise ValueError(f"cursor[{key!r}] has no position for {stream!r}")
    return out


def dump_cursor(cursor: Cursor) -> str:
    """Serialise a cursor as compact JSON with sorted keys."""
    return dumps(dict(sorted(check_cursor(cursor).items()))).decode()


def load_cursor(data: str | bytes) -> Cursor:
    """Parse a cursor saved by :func:`dump_cursor`; raise ValueError if it is not one."""
    return check_cursor(loads(data))


# --- chains ---------------------------------------------------------------------------------


def stream_order(stream: str) -> tuple[str, int, str]:
    """Sort key of a stream: topic, then numeric partition."""
    try:
        topic, partition = parse_stream(stream)
    except ValueError:
        return stream, -1, stream
    return topic, partition, stream


async def list_streams(store: ObjectStore, ref: CorpusRef) -> list[str]:
    """The chains of a corpus (``<topic>-<partition>``), by topic then numeric partition."""
    prefix = f"{ref.root}/_manifest/"
    streams = {
        rest.split("/", 1)[0]
        for rest in (key[len(prefix) :] for key in await store.list(prefix))
        if "/" in rest
    }
    return sorted(streams, key=stream_order)


async def end_cursor(store: ObjectStore, ref: CorpusRef) -> Cursor:
    """A cursor at the head of every chain: reading from it yields only later commits."""
    cursor: Cursor = {}
    for stream in await list_streams(store, ref):
        keys = await chain_keys(store, ref, stream)
        if keys:
            cursor[stream] = (await read_commit(store, keys[-1][1])).last_offset + 1
    return cursor


async def _checked_commit(store: ObjectStore, key: str, stream: str, position: int) -> Commit:
    """Read the commit at ``key`` and check it continues ``stream`` at ``position``."""
    try:
        commit = await read_commit(store, key)
    except ObjectNotFoundError:
        raise ChainError(f"{key}: commit listed but gone (expired while reading?)") from None
    if commit.stream != stream or commit.from_offset != position:
        raise ChainError(
            f"{key}: commit says {commit.stream} from {commit.from_offset}, "
            f"its name says {stream} from {position}"
        )
    # Without this a commit ending before it starts would send the walk back forever.
    if commit.last_offset < commit.from_offset:
        raise ChainError(f"{key}: last_offset {commit.last_offset} < from_offset {position}")
    return commit


# --- latest revision per trace --------------------------------------------------------------


class _Latest:
    """The latest revision per trace; on equal revisions a tombstone wins (deletion is final)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def apply(self, row: dict[str, Any]) -> None:
        trace_id, revision = row.get("trace_id"), row.get("revision")
        if not isinstance(trace_id, str) or isinstance(revision, bool):
            raise ChainError(f"record without a trace_id or revision: {str(row)[:200]}")
        if not isinstance(revision, int):
            raise ChainError(f"record of {trace_id} has revision {revision!r}")
        current = self.rows.get(trace_id)
        if current is not None:
            if revision < current["revision"]:
                return
            if revision == current["revision"] and not row.get("deleted"):
                return
            del self.rows[trace_id]  # re-insert: keep the order in which revisions were read
        self.rows[trace_id] = row

    def live(self) -> list[dict[str, Any]]:
        return [row for row in self.rows.values() if not row.get("deleted")]


# --- the reader -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectLines:
    """One verified object of a corpus, its lines unparsed, as the object's bytes.

    ``key`` is the object's store key (a compaction part or a commit's shard); ``data`` its
    lines after the cursor, in order, each ending with a newline (``count`` of them), checked
    against the object's sha256 and record count before they are handed out. Kept as one
    buffer, not a list of lines: a consumer that stores them as they are (the web service's
    index) never copies a line.
    """

    key: str
    data: bytes
    count: int
    columns: Any = None  # with ``columns=True``: the object's index sidecar (a pyarrow Table)
    compacted: bool = False  # a part of the compaction the read started from

    @property
    def lines(self) -> list[bytes]:
        """The lines, newline included (a copy of each)."""
        return block_lines((self.data, 0, len(self.data))) if self.data else []


@dataclass(frozen=True)
class _Span:
    """One verified object after the cursor, before any of it is handed out.

    ``data`` holds its lines after the cursor (``count`` of them; the ``skipped`` before them
    were handed out earlier). ``move(n)`` sets the cursor after the object's first ``n``
    lines, past the object when ``n`` is all of them: the one place a walk's cursor moves.
    """

    key: str
    data: bytes
    count: int
    skipped: int
    move: Callable[[int], None]
    columns: Any = None  # the sidecar's rows after the cursor, in place of ``data``
    compacted: bool = False


class CorpusReader:
    """Stream one corpus's records; not safe for two iterations of one reader at once."""

    def __init__(
        self, store: ObjectStore, ref: CorpusRef, *, poll_interval_s: float = 1.0,
        columns: bool = False, refused: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        """``columns``: :meth:`follow_objects` hands out an object's index sidecar (its
        columns and line places, :mod:`rl_export.corpora.sidecar`) instead of its lines
        where it has one; ``refused(reason)`` hears of each sidecar refused (then read whole).
        """
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
        self.store = store
        self.ref = ref
        self.poll_interval_s = poll_interval_s
        self.columns = columns
        self.refused = refused
        self._cursor: Cursor = {}
        self._compaction: Compaction | None = None
        # A read of a pinned version: the chains' ends, and the traces erased since (left out).
        self._until: dict[str, int] | None = None
        self._erased: frozenset[str] = frozenset()

    @property
    def cursor(self) -> Cursor:
        """Where the records handed out so far end (a copy: save it, pass it back later)."""
        return dict(self._cursor)

    async def records(
        self, cursor: Cursor | None = None, *, latest_only: bool = False,
        version: Version | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:  # fmt: skip
        """Yield what the corpus holds after ``cursor`` (None: from the latest compaction).

        With ``version`` (:func:`rl_export.corpora.versions.get_version`) the read is the
        version's: from its compaction (or, with a cursor saved by such a read, from there) to
        the end of each chain it names, every record of a trace deleted since left out
        (deletion wins: :mod:`rl_export.corpora.erasures`).

        ``{}`` reads every chain from offset 0, without a compaction. With ``latest_only``
        everything available is read first, then only the latest revision per trace is
        yielded (tombstones hide earlier revisions and are not yielded); the cursor then
        moves to the end of what was read when the last record is handed out.
        """
        await self._begin(cursor, version)
        if not latest_only:
            async with contextlib.aclosing(self._read()) as rows:
                async for row in rows:
                    yield row
            return
        start = self.cursor
        latest = _Latest()
        async with contextlib.aclosing(self._read()) as rows:
            async for row in rows:
                latest.apply(row)
        end, self._cursor = self._cursor, start
        live = latest.live()
        for n, row in enumerate(live, start=1):
            if n == len(live):
                self._cursor = end
            yield row
        self._cursor = end

    async def follow(
        self, cursor: Cursor | None = None, *, stop: asyncio.Event | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Like :meth:`records`, then poll for new commits until ``stop`` is set.

        Every commit created before ``stop`` is set is yielded before this returns: ``stop``
        is checked before a pass, and the pass that sees it set is the last.
        """
        await self._begin(cursor)
        while True:
            stopping = stop is not None and stop.is_set()
            async with contextlib.aclosing(self._read()) as rows:
                async for row in rows:
                    yield row
            if stopping:
                return
            if stop is None:
                await asyncio.sleep(self.poll_interval_s)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval_s)

    async def follow_objects(
        self,
        cursor: Cursor | None = None,
        *,
        stop: asyncio.Event | None = None,
        caught_up: Callable[[float], None] | None = None,
    ) -> AsyncGenerator[ObjectLines, None]:
        """Like :meth:`follow`, one whole verified object at a time, its lines unparsed.

        For consumers that parse lines their own way (the web service's index hands them to
        DuckDB): the cursor moves past an object before it is handed out, so a saved cursor
        is always at an object's boundary (a cursor saved by :meth:`records` in the middle
        of an object is honoured: the object's first lines are dropped). After each pass
        over the chains, ``caught_up(t)`` is called with the ``time.monotonic()`` at which
        the pass began: everything committed before ``t`` has been handed out.
        """
        await self._begin(cursor)
        while True:
            stopping = stop is not None and stop.is_set()
            began = time.monotonic()
            async with contextlib.aclosing(self._read_objects()) as objects:
                async for item in objects:
                    yield item
            if caught_up is not None:
                caught_up(began)
            if stopping:
                return
            if stop is None:
                await asyncio.sleep(self.poll_interval_s)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval_s)

    # -- steps ---------------------------------------------------------------------------

    async def _read(self) -> AsyncGenerator[dict[str, Any], None]:
        """Yield everything after the cursor, moving it before each record is handed out."""
        async with contextlib.aclosing(self._walk()) as spans:
            async for span in spans:
                rows = await _rows(span)
                if not rows:
                    span.move(span.skipped)
                for n, row in enumerate(rows, start=span.skipped + 1):
                    # 4. Move the cursor before handing the record out: whoever holds the
                    # record holds a cursor that includes it.
                    span.move(n)
                    if self._erased and row.get("trace_id") in self._erased:
                        continue  # a version's read: the trace was deleted since
                    yield row

    async def _read_objects(self) -> AsyncGenerator[ObjectLines, None]:
        """:meth:`_read` one object at a time, lines unparsed, the cursor moved past each."""
        async with contextlib.aclosing(self._walk()) as spans:
            async for span in spans:
                span.move(span.skipped + span.count)
                yield ObjectLines(span.key, span.data, span.count, span.columns, span.compacted)

    async def _walk(self) -> AsyncGenerator[_Span, None]:
        """Every object after the cursor, verified, in reading order; the caller moves the
        cursor through each (:attr:`_Span.move`) before the next is read."""
        if CURSOR_GENERATION in self._cursor:  # 1. The compaction the cursor is in.
            async with contextlib.aclosing(self._compaction_spans()) as spans:
                async for span in spans:
                    yield span
        # 2. Every chain, in a fixed order (a version's: those it names).
        streams = await list_streams(self.store, self.ref)
        if self._until is not None:
            until = self._until
            streams = [s for s in streams if s in until]
            missing = sorted(
                s for s in until if s not in streams and until[s] > self._cursor.get(s, 0)
            )
            if missing:
                raise ChainError(f"{self.ref.root}: no chain {missing[0]} (the version's)")
        for stream in streams:
            async with contextlib.aclosing(self._chain_spans(stream)) as spans:
                async for span in spans:
                    yield span

    async def _compaction_spans(self) -> AsyncGenerator[_Span, None]:
        generation = self._cursor[CURSOR_GENERATION]
        skip = self._cursor.get(CURSOR_GENERATION_SKIP, 0)
        compaction = self._compaction
        if compaction is None or compaction.generation != generation:
            compaction = await self._load_generation(generation)
        where = self.ref.compaction_key(generation)
        positions = check_cursor(compaction.positions)
        try:
            parts = [compaction_part(self.ref, p) for p in compaction.parts]
        except (KeyError, TypeError, AttributeError) as exc:
            raise ChainError(f"{where}: a part without {exc}") from None
        total = sum(p.records for p in parts)
        if total != compaction.records:
            raise ChainError(
                f"{where}: its parts hold {total} records, it says {compaction.records}"
            )
        if skip > total:
            raise ChainError(f"{where}: the cursor skips {skip} records, it has {total}")

        def mover(before: int) -> Callable[[int], None]:
            def move(n: int) -> None:  # n: the part's records handed out
                if before + n == total:  # the last record (parts after it may be empty)
                    self._cursor = dict(positions)
                else:
                    self._cursor[CURSOR_GENERATION_SKIP] = before + n

            return move

        done = 0
        for part in parts:
            before, done = done, done + part.records
            if skip >= done:
                continue
            skipped = max(skip - before, 0)
            columns = await self._columns(part, skipped)
            data = b"" if columns is not None else await _object_data(
                self.store, part, "its compaction")  # fmt: skip
            yield _Span(part.key, _drop_lines(data, skipped), part.records - skipped, skipped,
                        mover(before), columns, compacted=True)  # fmt: skip
        self._cursor = dict(positions)
        self._compaction = None

    async def _chain_spans(self, stream: str) -> AsyncGenerator[_Span, None]:
        # 3. Follow the chain from the cursor; verify each shard before yielding from it.
        skip_key = stream + SKIP_SUFFIX
        position = self._cursor.get(stream, 0)
        skip = self._cursor.get(skip_key, 0)
        by_offset = dict(await chain_keys(self.store, self.ref, stream))

        def mover(position: int, commit: Commit) -> Callable[[int], None]:
            def move(n: int) -> None:  # n: the shard's records handed out
                if n == commit.records:
                    self._advance(stream, commit.last_offset + 1)
                else:
                    self._cursor[stream] = position
                    self._cursor[skip_key] = n

            return move

        end = None if self._until is None else self._until[stream]
        while position in by_offset and (end is None or position < end):
            commit = await _checked_commit(self.store, by_offset[position], stream, position)
            if skip > commit.records:
                raise ChainError(
                    f"{by_offset[position]}: the cursor skips {skip} records, "
                    f"it has {commit.records}"
                )
            part = commit_part(self.ref, commit)
            columns = await self._columns(part, skip)
            data = b"" if columns is not None else await _object_data(
                self.store, part, "its commit")  # fmt: skip
            yield _Span(part.key, _drop_lines(data, skip), commit.records - skip, skip,
                        mover(position, commit), columns)  # fmt: skip
            position, skip = commit.last_offset + 1, 0
        check_chain_end(self.ref, stream, position, end, by_offset)

    async def _columns(self, part: Part, skip: int) -> Any:
        """The object's sidecar rows after ``skip``, when reading columns and it has a sidecar
        that describes it; None to read the object itself (a refused sidecar is reported)."""
        if not self.columns or part.index is None:
            return None
        from rl_export.corpora.sidecar import usable_sidecar  # pyarrow: on use

        table = await usable_sidecar(self.store, self.ref, part, refused=self.refused)
        if table is None:
            return None
        return table.slice(skip) if skip else table

    async def _begin(self, cursor: Cursor | None, version: Version | None = None) -> None:
        self._compaction = None
        self._until, self._erased = None, frozenset()
        if version is not None:
            if (version.org, version.project, version.corpus) != (
                self.ref.org,
                self.ref.project,
                self.ref.corpus,
            ):
                raise ValueError(f"version {version.name!r} is not of {self.ref.root}")
            self._until = dict(version.ends)
            self._erased = await erased_traces(self.store, self.ref.org, self.ref.project)
        if cursor is not None:
            self._cursor = check_cursor(cursor)
            return
        # 1. No cursor: the latest compaction first (a version's: its own).
        if version is None:
            self._compaction = await latest_compaction(self.store, self.ref)
        elif version.generation is not None:
            self._compaction = await self._load_generation(version.generation)
        self._cursor = {}
        if self._compaction is not None:
            self._cursor = {
                CURSOR_GENERATION: self._compaction.generation,
                CURSOR_GENERATION_SKIP: 0,
            }

    async def _load_generation(self, generation: int) -> Compaction:
        key = self.ref.compaction_key(generation)
        try:
            return Compaction.model_validate(loads(await self.store.get(key)))
        except ObjectNotFoundError:
            raise ChainError(f"{key}: the cursor's compaction no longer exists") from None
        except ValueError as exc:
            raise ChainError(f"{key}: unreadable compaction ({exc})") from None

    def _advance(self, stream: str, position: int) -> None:
        self._cursor.pop(stream + SKIP_SUFFIX, None)
        self._cursor[stream] = position


async def _object_data(store: ObjectStore, part: Part, named_by: str) -> bytes:
    """Every line of an object as one buffer, verified (sha256, and the record count
    ``named_by`` gives) before it is returned."""
    blocks = [block async for block in object_blocks(store, part)]
    if len(blocks) == 1 and blocks[0][1] == 0 and blocks[0][2] == len(blocks[0][0]):
        joined = blocks[0][0]
    else:
        joined = b"".join(memoryview(chunk)[start:end] for chunk, start, end in blocks)
    count = joined.count(b"\n")
    if count != part.records:
        raise ChainError(f"{part.key}: {count} records, {named_by} says {part.records}")
    return joined


_PARSE_IN_THREAD = 1 << 20
"""Objects larger than this are parsed in a thread: the event loop keeps its turn."""


async def _rows(span: _Span) -> list[dict[str, Any]]:
    """A span's records, each checked to be a JSON object (ChainError if not)."""
    try:
        if len(span.data) > _PARSE_IN_THREAD:
            rows = await asyncio.to_thread(_parse_lines, span.data)
        else:
            rows = _parse_lines(span.data)
    except ValueError as exc:
        raise ChainError(f"{span.key}: unreadable ({exc})") from None
    if len(rows) != span.count:  # a line break inside a line (a bare \r), say
        raise ChainError(f"{span.key}: {len(rows)} records parsed, {span.count} lines")
    for number, row in enumerate(rows, start=span.skipped + 1):
        if not isinstance(row, dict):
            raise ChainError(f"{span.key}: line {number} is not a JSON object")
        upgrade_record(row)  # record schema 2's labels read as human_labels
    return rows


def _parse_lines(data: bytes) -> list[Any]:
    return list(iter_lines(data))


def _drop_lines(data: bytes, count: int) -> bytes:
    """``data`` without its first ``count`` lines."""
    start = 0
    for _ in range(count):
        start = data.index(b"\n", start) + 1
    return data[start:] if start else data
