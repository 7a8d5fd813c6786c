"""The query index: the latest revision per trace of each followed corpus, in DuckDB.

Why DuckDB (measured on this machine, 1,000,000 rows, README "Web service"): the Export tab's
stats are aggregates over every matching record, and SQLite answered them in 240 to 900 ms
(a row at a time), DuckDB in 20 to 30 ms (a column at a time); the queue's "oldest traces
this labeler has not seen" is a top-N that DuckDB answers in about 5 ms. DuckDB is slow to
store large strings (about 23 µs a record for the bodies, against 4 µs for the columns), so
the bodies stay out of it, in local segment files (:mod:`rl_export.index.segments`), and the
index keeps where each one is.

One row per (corpus, trace): the columns the filters need (docs/guides/exports.md: reward,
passed, labels, agent version, scenario, updated_at, the worst severity, the report types
that passed and the labelers' spread; :mod:`rl_export.index.sql`), ``labelers`` and
``skipped_by`` for the queue, ``seq`` (the order lines were read, for previews), and the
body's location. A tombstone keeps its row (``deleted``) so an older revision read later
cannot bring the trace back.

An object with an index sidecar (:mod:`rl_export.corpora.sidecar`, verified by the reader)
is ingested from its columns (:meth:`QueryIndex.ingest_columns`): DuckDB reads the Parquet
rows in place of parsing 4 KiB of JSON per record, and the bodies stay in the store object:
the object gets a segment number of its own (table ``remote``), each row keeps its line's
offset and length there, and a body is fetched by range when a preview or the queue shows
it. Should the object expire (after a compaction covered it) the corpus is read again from
that compaction (:class:`BodiesGone`).

How verified corpus lines are ingested (:meth:`QueryIndex.ingest`, on one of the indexer's
writer threads), in slices of at most ``SLICE`` lines:

1. Write the slice's bytes as they are, as a new segment; find where each line starts (the
   newlines, found in C).
2. Let DuckDB's JSON reader read that segment and extract the columns (C++: no line is
   parsed or copied in Python). Its rows keep the file's order (``preserve_insertion_order``,
   DuckDB's default), so the n-th row is the n-th line: the row count must match, and a few
   rows' trace ids are checked against the bytes at their offsets before anything is kept
   (:func:`rl_export.index.batches.from_json`; sidecars' batches are
   :func:`~rl_export.index.batches.from_columns`).
3. In one transaction: keep the best line per trace of the slice (greatest revision, a
   tombstone on a tie, else the first read: the reader's rule), delete the rows it replaces,
   insert the traces that have no row, and save the corpus's cursor with the last slice.
   Ingesting a line twice changes nothing, so a crash between slices only means reading
   them again.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from rl_export.corpora.reader import Cursor, check_cursor
from rl_export.formats.filters import Filters
from rl_export.index.batches import IndexError_, Narrow, Slice, first_row, from_columns, from_json
from rl_export.index.gate import Gate
from rl_export.index.memo import Memo
from rl_export.index.segments import Segments
from rl_export.index.sql import BINS, RECORD_COLUMNS, filter_sql
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectNotFoundError
from rl_export.model.records import upgrade_line

SCHEMA_VERSION = "8"  # bumped when the index or its segments change: rebuilt from the corpora

SLICE = 20_000
MEMO_ENTRIES = 256
"""Answers kept per index (:meth:`QueryIndex.memo`): a few numbers each, per labeler and
scope of a team's queues."""
T = TypeVar("T")
_NEWLINE = re.compile(b"\n")


class BodiesGone(Exception):
    """A body the index points to is in a store object that no longer exists (its history
    expired after a compaction covered it): the corpus is read again from that compaction."""


@dataclass(frozen=True)
class CorpusKey:
    """A corpus the index follows."""

    org: str
    project: str
    corpus: str

    @property
    def name(self) -> str:
        return f"{self.org}/{self.project}/{self.corpus}"


@dataclass(frozen=True)
class Stats:
    records: int
    rewarded: int
    reward_sum: float
    judged: int
    passed: int
    human_labeled: int
    histogram: list[int]


class QueryIndex:
    """The DuckDB index and its segments under one folder (see the module)."""

    def __init__(
        self, directory: Path, *, threads: int = 2, memory: str = "1GB", writers: int = 2
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.db = self._open(threads, memory)
        if not self._consistent():
            # A cache: when it does not match its segments (a crash before the bytes were
            # written out), start again from the corpora.
            self.db.close()
            shutil.rmtree(directory / "segments", ignore_errors=True)
            for name in ("index.duckdb", "index.duckdb.wal"):
                (directory / name).unlink(missing_ok=True)
            self.db = self._open(threads, memory)
        self.segments = Segments(directory / "segments")
        row = self.db.execute("SELECT max(seg) FROM remote").fetchone()
        if row is not None and row[0] is not None:  # never reuse a remote segment's number
            self.segments.next = max(self.segments.next, int(row[0]) + 1)
        self._remote: dict[int, tuple[int, str]] = {
            int(s): (int(c), str(k))
            for s, c, k in self.db.execute("SELECT seg, corpus_id, key FROM remote").fetchall()
        }  # seg -> (corpus id, object key): read by any thread, written by the writer's
        # Fetches byte ranges ``(start, length)`` of a store object (the indexer sets it);
        # ``gone(corpus_id)`` is told when a remote body's object no longer exists.
        self.fetch: Callable[[str, list[tuple[int, int]]], list[bytes]] | None = None
        self.gone: Callable[[int], None] | None = None
        self._local = threading.local()
        self._lock = threading.Lock()  # registering a corpus (a new id), one at a time
        self._gate = Gate(writers)  # ingests side by side, segment maintenance alone
        self._json = threading.Lock()  # DuckDB's JSON reads (of objects without sidecars)
        self._changes: dict[int, int] = {}  # corpus id -> how often its rows changed
        self._changes_lock = threading.Lock()  # (writers in several threads)
        self._memo = Memo(MEMO_ENTRIES)  # (queries run in several threads)

    def changes(self, corpus_id: int) -> int:
        """How many times the corpus's rows changed since this process opened the index. An
        answer computed from them after reading this holds as long as it does not move
        (each write counts once committed)."""
        return self._changes.get(corpus_id, 0)

    def memo(self, corpus_id: int, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, an answer over the corpus's rows named by ``key`` (its SQL and
        parameters), kept while those rows do not change: a claim's queue counts scan every
        row of the corpus, and a team claims many times between two changes.

        One computation of an answer at a time (:class:`~rl_export.index.memo.Memo`): the
        team's labelers all ask for it after a change, and the others wait for the first
        rather than scan too.
        """
        # The count of changes is read before computing: an answer from older rows is never
        # kept under a newer count.
        return self._memo.get((corpus_id, self.changes(corpus_id), key), compute)

    def _changed(self, corpus_id: int) -> None:
        with self._changes_lock:
            self._changes[corpus_id] = self._changes.get(corpus_id, 0) + 1

    @property
    def writers(self) -> int:
        """How many ingests may run at once."""
        return self._gate.writers

    def _open(self, threads: int, memory: str) -> duckdb.DuckDBPyConnection:
        db = duckdb.connect(
            str(self.directory / "index.duckdb"),
            # Never fetch an extension from the network; the JSON reader is built in.
            config={
                "threads": threads,
                "memory_limit": memory,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
        db.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is not None and row[0] != SCHEMA_VERSION:
            for table in ("records", "corpora", "seen", "remote"):  # seen: before version 7
                db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute(
            "CREATE TABLE IF NOT EXISTS corpora (id INTEGER PRIMARY KEY, org VARCHAR, "
            "project VARCHAR, corpus VARCHAR, cursor VARCHAR, lines BIGINT)"
        )
        db.execute(f"CREATE TABLE IF NOT EXISTS records ({RECORD_COLUMNS})")
        # Segment numbers whose bodies stay in the store: the object a sidecar described.
        db.execute(
            "CREATE TABLE IF NOT EXISTS remote (seg INTEGER PRIMARY KEY, corpus_id INTEGER, "
            "key VARCHAR)"
        )
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", [SCHEMA_VERSION])
        return db

    def _consistent(self) -> bool:
        rows = self.db.execute(
            "SELECT seg, max(off + len + 1) FROM records WHERE seg IS NOT NULL "
            "AND seg NOT IN (SELECT seg FROM remote) GROUP BY seg"
        ).fetchall()  # the end of a record's line: its body, then the newline
        folder = self.directory / "segments"
        for seg, end in rows:
            path = folder / f"{int(seg):08d}.jsonl"
            if not path.exists() or path.stat().st_size < int(end):
                return False
        return True

    def close(self) -> None:
        self.db.close()

    # -- corpora -------------------------------------------------------------------------

    def corpus_id(self, key: CorpusKey) -> int:
        """The id of a corpus, registered on first use."""
        with self._lock:
            found = self.db.execute(
                "SELECT id FROM corpora WHERE org = ? AND project = ? AND corpus = ?",
                [key.org, key.project, key.corpus],
            ).fetchone()
            if found is not None:
                return int(found[0])
            row = self.db.execute("SELECT coalesce(max(id), 0) + 1 FROM corpora").fetchone()
            assert row is not None
            self.db.execute(
                "INSERT INTO corpora VALUES (?, ?, ?, ?, NULL, 0)",
                [row[0], key.org, key.project, key.corpus],
            )
            return int(row[0])

    def cursor(self, corpus_id: int) -> Cursor | None:
        """Where the corpus's reading stopped (None: from its latest compaction)."""
        db = self._writing()
        row = first_row(db.execute("SELECT cursor FROM corpora WHERE id = ?", [corpus_id]))
        if row is None or row[0] is None:
            return None
        return check_cursor(loads(row[0]))

    def reset(self, corpus_id: int) -> None:
        """Forget a corpus's rows and cursor (its history expired under the cursor)."""
        db = self._writing()
        with self._gate.shared(), self._transaction(db):
            db.execute("DELETE FROM records WHERE corpus_id = ?", [corpus_id])
            db.execute("DELETE FROM remote WHERE corpus_id = ?", [corpus_id])
            for seg in [s for s, (c, _) in list(self._remote.items()) if c == corpus_id]:
                del self._remote[seg]
            db.execute("UPDATE corpora SET cursor = NULL, lines = 0 WHERE id = ?", [corpus_id])
        self._changed(corpus_id)

    @staticmethod
    @contextlib.contextmanager
    def _transaction(db: duckdb.DuckDBPyConnection) -> Iterator[None]:
        db.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- ingest (the indexer's writer threads: see rl_export.index.gate) --------------------

    def _save_cursor(self, corpus_id: int, cursor: Cursor) -> None:
        """Where the corpus is read to, when what came held no line."""
        self._writing().execute(
            "UPDATE corpora SET cursor = ? WHERE id = ?", [dumps(cursor).decode(), corpus_id]
        )

    def ingest(self, corpus_id: int, data: bytes, cursor: Cursor | None) -> None:
        """Take verified corpus lines (one buffer, each line ending with a newline) and the
        cursor after them (see the module; None: lines from rl_export.web.fresh)."""
        with self._gate.shared():
            if not data and cursor is not None:
                self._save_cursor(corpus_id, cursor)
            if not data:
                return
            if not data.endswith(b"\n"):
                raise IndexError_("the lines do not end with a newline")
            # 1. Where every line starts (and, last, where the data ends).
            starts = [0, *(m.end() for m in _NEWLINE.finditer(data))]
            view = memoryview(data)
            lines = len(starts) - 1
            for first in range(0, lines, SLICE):
                last = min(first + SLICE, lines)
                begin, end = starts[first], starts[last]
                segment, path = self.segments.write(view[begin:end])
                offsets = [start - begin for start in starts[first:last]]
                lengths = [b - a - 1 for a, b in itertools.pairwise(starts[first : last + 1])]
                batch = from_json(self._writing(), segment, path,
                                  Slice(offsets, lengths, data, begin), self._json)  # fmt: skip
                try:
                    self._apply(corpus_id, len(offsets), cursor if last == lines else None, batch)
                except duckdb.Error as exc:
                    path.unlink(missing_ok=True)
                    raise IndexError_(f"DuckDB could not take the batch: {exc}") from exc
                except IndexError_:
                    path.unlink(missing_ok=True)
                    raise

    def ingest_columns(
        self, corpus_id: int, objects: list[tuple[str, Any]], cursor: Cursor, *,
        fresh: bool = False,
    ) -> None:  # fmt: skip
        """Take objects' index sidecar rows (``(key, table)``: a pyarrow Table of
        :data:`rl_export.corpora.sidecar.SCHEMA`, verified by the reader, after the cursor's
        skip), in reading order, and the cursor after the last, in one transaction: the
        rows' columns, their bodies left in each store object ``key`` at the sidecar's line
        places (fetched by range when shown). ``fresh``: parts of the compaction the corpus is
        being read from (see :meth:`_apply`)."""
        objects = [(key, table) for key, table in objects if table.num_rows]
        with self._gate.shared():
            if not objects:
                self._save_cursor(corpus_id, cursor)
                return
            first = self.segments.reserve(len(objects))
            remote = [(first + n, key) for n, (key, _) in enumerate(objects)]
            try:
                self._apply(corpus_id, sum(t.num_rows for _, t in objects), cursor,
                            from_columns(self._writing(), first, [t for _, t in objects]),
                            remote=remote, fresh=fresh)  # fmt: skip
            except duckdb.Error as exc:
                raise IndexError_(f"DuckDB could not take the sidecars of {objects[0][0]} "
                                  f"and after: {exc}") from exc  # fmt: skip
            for seg, key in remote:
                self._remote[seg] = (corpus_id, key)

    def _apply(
        self, corpus_id: int, count: int, cursor: Cursor | None,
        batch: contextlib.AbstractContextManager[Narrow], *,
        remote: list[tuple[int, str]] | None = None, fresh: bool = False,
    ) -> None:  # fmt: skip
        """Steps 2 and 3 for the ``count`` lines of ``batch``. ``fresh``: the
        batch's traces have no row in this corpus yet (parts of the compaction the corpus is
        read from: their traces are distinct, and the index holds nothing else of the corpus
        then), so nothing is looked up or replaced."""
        db = self._writing()
        # 2. The lines' columns, places and segments, as ``batch`` (a temporary table or
        # view); ``_q``, the order they were read in (segment, then place): their ``seq``.
        # Made before the transaction and dropped after it: a failed transaction is rolled
        # back first, so its error is the one raised.
        with batch as narrow, self._transaction(db):
            if remote:
                db.executemany(
                    "INSERT INTO remote VALUES (?, ?, ?)",
                    [[seg, corpus_id, key] for seg, key in remote],
                )
            # 3. The best line per trace, the rows it replaces, the traces that have none,
            # decided on the lines' keys alone (a small table, so each join builds its hash
            # table on the batch, not on the corpus's rows); then their columns, once.
            db.execute(
                "CREATE OR REPLACE TEMP TABLE keys AS SELECT trace_id, revision, deleted, _q "
                "FROM batch"
            )
            repeated = db.execute("SELECT count(*) - count(DISTINCT trace_id) FROM keys")
            row = first_row(repeated)
            if row is not None and row[0]:  # a trace twice in the slice: keep its best line
                db.execute(
                    "DELETE FROM keys WHERE _q NOT IN (SELECT _q FROM keys QUALIFY "
                    "row_number() OVER (PARTITION BY trace_id ORDER BY revision DESC, "
                    "deleted DESC, _q) = 1)"
                )
            if not fresh:
                db.execute(
                    "DELETE FROM records USING keys b WHERE records.corpus_id = ? "
                    "AND records.trace_id = b.trace_id AND (b.revision > records.revision OR "
                    "(b.revision = records.revision AND b.deleted AND NOT records.deleted))",
                    [corpus_id],
                )
                db.execute(  # the rows left for these traces are as good: keep them
                    "DELETE FROM keys WHERE trace_id IN (SELECT trace_id FROM records WHERE "
                    "corpus_id = ? AND trace_id IN (SELECT trace_id FROM keys))",
                    [corpus_id],
                )
            where = ""
            if not fresh or (row and row[0]):  # only the lines left in ``keys``
                if narrow is None:
                    where = " WHERE _q IN (SELECT _q FROM keys)"
                else:
                    narrow(db.execute("SELECT _q FROM keys").fetchnumpy()["_q"])
            # seq: the segment's number, then the place in it: the order lines were read.
            db.execute(
                "INSERT INTO records SELECT ?, trace_id, revision, deleted, reward, passed, "
                "labels_count, agent_version, scenario, updated_at, completed_at, max_severity, "
                "pass_dims, labelers, skipped_by, _q, "
                "CASE WHEN deleted THEN NULL ELSE _seg END, _o, _n, labeled, bucket, "
                "completed_us, spread, labels, adjudication, results, pass_threshold, eval_reward, "
                "eval_passed, eval_split FROM batch" + where,
                [corpus_id],
            )
            db.execute("DROP TABLE keys")
            if cursor is None:
                db.execute("UPDATE corpora SET lines = lines + ? WHERE id = ?", [count, corpus_id])
            else:
                db.execute(
                    "UPDATE corpora SET cursor = ?, lines = lines + ? WHERE id = ?",
                    [dumps(cursor).decode(), count, corpus_id],
                )
        self._changed(corpus_id)

    def collect_segments(self) -> list[int]:
        """Delete the segments no row points into (and forget such remote ones); return the
        local ones deleted."""
        db = self._writing()
        with self._gate.exclusive():
            rows = db.execute("SELECT DISTINCT seg FROM records WHERE seg IS NOT NULL").fetchall()
            used = {int(r[0]) for r in rows}
            unused = [seg for seg in self._remote if seg not in used]
            if unused:
                db.execute("DELETE FROM remote WHERE list_contains(?, seg)", [unused])
                for seg in unused:
                    del self._remote[seg]
            return self.segments.remove(used)

    def compact_segments(self, *, small_bytes: int = 8 << 20, min_segments: int = 8) -> int:
        """Rewrite the live bodies of a corpus's small or mostly dead segments into new ones;
        return how many segments were merged (then :meth:`collect_segments` removes them).

        Following a corpus writes a segment per object read, and new revisions leave dead
        bodies behind: without this, files and dead bytes pile up. Per corpus, once at least
        ``min_segments`` segments are under ``small_bytes`` or less than half live, their live
        lines (in read order) become new segments, and the rows point there, in one
        transaction. A reader that found a row in an old segment asks again.
        """
        merged = 0
        with self._gate.exclusive():
            live = (
                self._writing()
                .execute(
                    "SELECT corpus_id, seg, sum(len + 2) FROM records WHERE seg IS NOT NULL "
                    "AND seg NOT IN (SELECT seg FROM remote) GROUP BY ALL ORDER BY corpus_id, seg"
                )
                .fetchall()
            )  # bodies left in the store are not copied here
            chosen: dict[int, list[int]] = {}
            for corpus_id, seg, live_bytes in live:
                size = self.segments.size(int(seg))
                if size < small_bytes or int(live_bytes) * 2 < size:
                    chosen.setdefault(int(corpus_id), []).append(int(seg))
            for corpus_id, segs in chosen.items():
                if len(segs) >= min_segments:
                    self._merge(corpus_id, segs)
                    merged += len(segs)
        return merged

    def _merge(self, corpus_id: int, segs: list[int]) -> None:
        db = self._writing()
        rows = db.execute(
            "SELECT trace_id, seg, off, len FROM records WHERE corpus_id = ? "
            "AND list_contains(?, seg) ORDER BY seq",
            [corpus_id, segs],
        ).fetchall()
        for start in range(0, len(rows), SLICE):
            part = rows[start : start + SLICE]
            bodies = self.bodies_at([r[1:] for r in part])
            offsets = list(itertools.accumulate((len(b) + 1 for b in bodies[:-1]), initial=0))
            segment, path = self.segments.write(b"\n".join(bodies) + b"\n")
            try:
                with self._transaction(db):
                    db.execute(
                        "UPDATE records SET seg = ?, off = o.off, len = o.len FROM (SELECT "
                        "unnest(?::VARCHAR[]) AS trace_id, unnest(?::BIGINT[]) AS off, "
                        "unnest(?::BIGINT[]) AS len) o WHERE records.corpus_id = ? AND "
                        "records.trace_id = o.trace_id AND list_contains(?, records.seg)",
                        [segment, [r[0] for r in part], offsets, [len(b) for b in bodies],
                         corpus_id, segs],
                    )  # fmt: skip
            except BaseException:
                path.unlink(missing_ok=True)
                raise

    # -- queries (any thread) ------------------------------------------------------------

    def connection(self) -> duckdb.DuckDBPyConnection:
        """This thread's connection to the index for queries (they run on any thread)."""
        cursor: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._local.cursor = self.db.cursor()
        return cursor

    def _writing(self) -> duckdb.DuckDBPyConnection:
        """This thread's connection for writes (the indexer's writer threads: DuckDB runs
        their transactions side by side), apart from its queries' so that a query's open
        result never meets a write's ``register``."""
        cursor: duckdb.DuckDBPyConnection | None = getattr(self._local, "writing", None)
        if cursor is None:
            cursor = self._local.writing = self.db.cursor()
        return cursor

    def live_counts(self) -> dict[int, int]:
        """Live records per corpus id."""
        rows = (
            self.connection()
            .execute(
                "SELECT corpus_id, count(*) FILTER (WHERE NOT deleted) FROM records GROUP BY ALL"
            )
            .fetchall()
        )
        return {int(c): int(n) for c, n in rows}

    def _matching(self, corpus_id: int, filters: Filters) -> tuple[str, list[Any]]:
        """A subquery of the corpus's records that pass the filters (``limit`` in seq order)."""
        where, params = filter_sql(filters)
        sql = f"SELECT * FROM records WHERE corpus_id = ? AND {where}"
        if filters.limit is not None:
            sql += " ORDER BY seq LIMIT ?"
            return sql, [corpus_id, *params, filters.limit]
        return sql, [corpus_id, *params]

    def stats(self, corpus_id: int, filters: Filters) -> Stats:
        """What :class:`~rl_export.export.stats.StatsAccumulator` gives over the matches."""
        sql, params = self._matching(corpus_id, filters)
        rows = (
            self.connection()
            .execute(
                "SELECT bucket, count(*), count(reward), coalesce(sum(reward), 0), "
                "count(passed), coalesce(count_if(passed), 0), coalesce(count_if(labeled), 0) "
                f"FROM ({sql}) GROUP BY bucket",
                params,
            )
            .fetchall()
        )
        counts = [0] * BINS
        totals = [0, 0, 0.0, 0, 0, 0]
        for bucket, *values in rows:
            if bucket is not None:
                counts[int(bucket)] = int(values[0])
            for n, value in enumerate(values):
                totals[n] += value
        return Stats(
            records=int(totals[0]), rewarded=int(totals[1]), reward_sum=float(totals[2]),
            judged=int(totals[3]), passed=int(totals[4]), human_labeled=int(totals[5]),
            histogram=counts,
        )  # fmt: skip

    def preview(self, corpus_id: int, filters: Filters, limit: int, offset: int = 0) -> list[bytes]:
        """The bodies of matching records in read order, from ``offset``."""
        sql, params = self._matching(corpus_id, filters.model_copy(update={"limit": None}))
        end = filters.limit
        if end is not None:
            limit = max(min(limit, end - offset), 0)
        rows = (
            self.connection()
            .execute(
                f"SELECT seg, off, len FROM ({sql}) ORDER BY seq LIMIT ? OFFSET ?",
                [*params, limit, offset],
            )
            .fetchall()
        )
        return self.bodies_at(rows)

    def bodies_at(self, rows: list[tuple[Any, ...]]) -> list[bytes]:
        """The bodies at (segment, offset, length) places: local segments read here, remote
        ones fetched from their store objects by range (one request per object).

        FileNotFoundError when a local segment went away under the query (ask again);
        :class:`BodiesGone` when a store object did (the corpus is then read again)."""
        return [upgrade_line(body) for body in self._bodies_at(rows)]  # schema 2: labels

    def _bodies_at(self, rows: list[tuple[Any, ...]]) -> list[bytes]:
        places = [(int(s), int(o), int(n)) for s, o, n in rows]
        remote = self._remote
        if not any(seg in remote for seg, _, _ in places):
            return self.segments.read_many(places)
        out: list[bytes | None] = [None] * len(places)
        local = [(n, p) for n, p in enumerate(places) if p[0] not in remote]
        for (n, _), body in zip(local, self.segments.read_many([p for _, p in local]),
                                strict=True):  # fmt: skip
            out[n] = body
        by_object: dict[int, list[int]] = {}
        for n, (seg, _, _) in enumerate(places):
            if seg in remote:
                by_object.setdefault(seg, []).append(n)
        for seg, numbers in by_object.items():
            corpus_id, key = remote[seg]
            for n, body in zip(numbers, self._fetch(corpus_id, key,
                                                    [places[n][1:] for n in numbers]),
                               strict=True):  # fmt: skip
                out[n] = body
        return [b for b in out if b is not None]

    def _fetch(self, corpus_id: int, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        if self.fetch is None:
            raise BodiesGone(f"{key}: no store to fetch bodies from")
        try:
            return self.fetch(key, ranges)
        except ObjectNotFoundError:
            if self.gone is not None:
                self.gone(corpus_id)
            raise BodiesGone(f"{key} no longer exists: the corpus is being read again") from None

    def has_trace(self, corpus_id: int, trace_id: str) -> bool:
        """Whether the corpus holds a live record of the trace."""
        sql = "SELECT 1 FROM records WHERE corpus_id = ? AND trace_id = ? AND NOT deleted"
        row = first_row(self.connection().execute(sql + " LIMIT 1", [corpus_id, trace_id]))
        return row is not None
