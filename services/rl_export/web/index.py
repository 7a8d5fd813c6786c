"""The query index: the latest revision per trace of each followed corpus, in DuckDB.

Why DuckDB (measured on this machine, 1,000,000 rows, README "Web service"): the Export tab's
stats are aggregates over every matching record, and SQLite answered them in 240 to 900 ms
(a row at a time), DuckDB in 20 to 30 ms (a column at a time); the queue's "oldest traces
this labeler has not seen" is a top-N that DuckDB answers in about 5 ms. DuckDB is slow to
store large strings (about 23 µs a record for the bodies, against 4 µs for the columns), so
the bodies stay out of it, in local segment files (:mod:`rl_export.web.segments`), and the
index keeps where each one is.

One row per (corpus, trace): the columns the filters need (DESIGN.md section 4: reward,
passed, labels, agent version, scenario, updated_at, the worst severity, the report types
that passed and the labelers' spread), ``labelers`` and ``skipped_by`` for the queue, ``seq``
(the order lines were read, for previews), and the body's location. A tombstone keeps its
row (``deleted``) so an older revision read later cannot bring the trace back.

How verified corpus lines are ingested (:meth:`QueryIndex.ingest`; one writer thread), in
slices of at most ``SLICE`` lines:

1. Write the slice's bytes as they are, as a new segment; find where each line starts (the
   newlines, found in C).
2. Let DuckDB's JSON reader read that segment and extract the columns (C++: no line is
   parsed or copied in Python). Its rows keep the file's order (``preserve_insertion_order``,
   DuckDB's default), so the n-th row is the n-th line: the row count must match, and a few
   rows' trace ids are checked against the bytes at their offsets before anything is kept.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import orjson

from rl_export.common.codec import dumps, loads
from rl_export.common.events import Rubric
from rl_export.common.filters import Filters
from rl_export.corpora.reader import Cursor, check_cursor
from rl_export.web.segments import Segments

SCHEMA_VERSION = "5"  # bumped when the index or its segments change: rebuilt from the corpora

SLICE = 20_000
CHECKED_ROWS = 64  # rows per slice whose trace id is checked against the segment's bytes
BINS = 10  # the reward histogram's bins over 0..1 (the export package's stats use ten)
_RUBRIC = "STRUCT(correctness UTINYINT, helpfulness UTINYINT, efficiency UTINYINT, safety UTINYINT)"
_COLUMNS = {
    "trace_id": "VARCHAR",
    "revision": "BIGINT",
    "deleted": "BOOLEAN",
    "reward": "DOUBLE",
    "passed": "BOOLEAN",
    "labels_count": "BIGINT",
    "agent_version": "VARCHAR",
    "scenario": "VARCHAR",
    "updated_at": "VARCHAR",
    "completed_at": "VARCHAR",
    "labelers": "VARCHAR[]",
    "skipped_by": "VARCHAR[]",
    "labels": f"STRUCT(labeler VARCHAR, rubric {_RUBRIC})[]",
    "evaluation": "STRUCT(report STRUCT(outcomes "
    "STRUCT(type VARCHAR, decision BOOLEAN, severity BIGINT)[]), "
    "results STRUCT(evaluator VARCHAR, score DOUBLE, passed BOOLEAN)[])",
    "pass_threshold": "DOUBLE",
}
# A report type passes when at least one of its outcomes was decided and none decided false
# (Filters.matches, pass-dimension); the worst severity counts an absent one as 0.
_OUTCOMES = "evaluation.report.outcomes"
_RESULTS = "evaluation.results"
_PASSES = f"list_transform({_RESULTS}, lambda r: r.passed)"
LABEL_SUM = "+".join(f"x.rubric.{d}" for d in Rubric.model_fields)
_EXTRACT = f"""
    trace_id, revision, coalesce(deleted, false) AS deleted, reward, passed,
    labels_count, agent_version, scenario,
    try_cast(updated_at AS TIMESTAMPTZ) AS updated_at,
    try_cast(completed_at AS TIMESTAMPTZ) AS completed_at,
    coalesce(list_max(list_transform({_OUTCOMES}, lambda o: coalesce(o.severity, 0))), 0)
        AS max_severity,
    coalesce(list_filter(
        list_distinct(list_transform(
            list_filter({_OUTCOMES}, lambda o: o.decision IS NOT NULL), lambda o: o.type)),
        lambda t: NOT list_contains(list_transform(
            list_filter({_OUTCOMES}, lambda o: o.decision = false), lambda o: o.type), t)
    ), []) AS pass_dims,
    coalesce(labelers, []) AS labelers, coalesce(skipped_by, []) AS skipped_by,
    coalesce(labels_count, 0) > 0 AS labeled,
    CASE WHEN reward IS NOT NULL THEN least(greatest(floor(reward * {BINS}), 0), {BINS} - 1)
        END::UTINYINT AS bucket,
    epoch_us(try_cast(completed_at AS TIMESTAMPTZ)) AS completed_us,
    CASE WHEN labels IS NULL THEN
            CASE WHEN coalesce(labels_count, 0) < 2 THEN 0.0 END
        WHEN len(labels) < 2 THEN 0.0
        ELSE (list_max(list_transform(labels, lambda x: {LABEL_SUM}))
              - list_min(list_transform(labels, lambda x: {LABEL_SUM}))) / 20.0
    END AS spread,
    labels, {_RESULTS} AS results, pass_threshold,
    CASE WHEN len({_RESULTS}) > 0 THEN list_avg(list_transform({_RESULTS}, lambda r: r.score))
        END AS eval_reward,
    CASE WHEN len({_RESULTS}) > 0 THEN list_bool_and({_PASSES}) END AS eval_passed,
    CASE WHEN len({_RESULTS}) > 0 THEN list_bool_or({_PASSES}) AND NOT list_bool_and({_PASSES})
        END AS eval_split
"""
# ``bucket`` is the reward's histogram bin and ``labeled`` whether a human label counts,
# computed once at ingest: as expressions in the stats query they cost it three times over.
# ``spread`` is filters.record_spread: NULL (unknown) for a record written before records
# carried ``labels`` that has two or more labels; (greatest - least sum) / 20 as a double.
# ``labels`` (NULL for such a record), ``results`` and ``pass_threshold`` feed the agreement
# report; ``eval_reward``, ``eval_passed`` and ``eval_split`` (the current evaluation's mean
# score, all passed, some passed and some not; NULL without results) the team's queue.
_RECORD_COLUMNS = (
    "corpus_id INTEGER, trace_id VARCHAR, revision BIGINT, deleted BOOLEAN, reward DOUBLE, "
    "passed BOOLEAN, labels_count BIGINT, agent_version VARCHAR, scenario VARCHAR, "
    "updated_at TIMESTAMPTZ, completed_at TIMESTAMPTZ, max_severity BIGINT, "
    "pass_dims VARCHAR[], labelers VARCHAR[], skipped_by VARCHAR[], seq BIGINT, "
    "seg INTEGER, off BIGINT, len BIGINT, labeled BOOLEAN, bucket UTINYINT, "
    "completed_us BIGINT, spread DOUBLE, "
    f"labels STRUCT(labeler VARCHAR, rubric {_RUBRIC})[], "
    "results STRUCT(evaluator VARCHAR, score DOUBLE, passed BOOLEAN)[], pass_threshold DOUBLE, "
    "eval_reward DOUBLE, eval_passed BOOLEAN, eval_split BOOLEAN"
)


_NEWLINE = re.compile(b"\n")


@dataclass(frozen=True)
class _Slice:
    """Where a slice's lines are: offsets and lengths in its segment, and its bytes."""

    offsets: list[int]
    lengths: list[int]
    data: bytes
    begin: int  # where the slice starts in ``data``


class IndexError_(Exception):
    """The index could not take a batch (a line DuckDB cannot read as a record)."""


@dataclass(frozen=True)
class CorpusKey:
    """A corpus the index follows."""

    org: str
    project: str
    corpus: str

    @property
    def name(self) -> str:
        return f"{self.org}/{self.project}/{self.corpus}"


def filter_sql(filters: Filters) -> tuple[str, list[Any]]:
    """The SQL condition (and its parameters) of :meth:`Filters.matches` over the index's
    columns; ``limit`` is the caller's. The unit tests check both agree on random records."""
    clauses = ["NOT deleted"]
    params: list[Any] = []

    def add(clause: str, value: Any) -> None:
        clauses.append(clause)
        params.append(value)

    if filters.passed is not None:
        add("passed = ?", filters.passed)
    if filters.min_reward is not None:
        add("reward >= ?", filters.min_reward)
    if filters.max_reward is not None:
        add("reward <= ?", filters.max_reward)
    if filters.agent_version is not None:
        add("agent_version = ?", filters.agent_version)
    if filters.scenario is not None:
        add("scenario = ?", filters.scenario)
    if filters.labeled is not None:
        add("(coalesce(labels_count, 0) > 0) = ?", filters.labeled)
    if filters.since is not None:
        add("updated_at >= ?", filters.since)
    if filters.until is not None:
        add("updated_at < ?", filters.until)
    if filters.pass_dimension:
        add("list_has_all(pass_dims, ?::VARCHAR[])", list(filters.pass_dimension))
    if filters.max_severity is not None:
        add("max_severity <= ?", filters.max_severity)
    if filters.min_labels is not None:
        add("coalesce(labels_count, 0) >= ?", filters.min_labels)
    if filters.max_spread is not None:
        add("spread <= ?", filters.max_spread)  # NULL (unknown) never passes
    return " AND ".join(clauses), params


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

    def __init__(self, directory: Path, *, threads: int = 2, memory: str = "1GB") -> None:
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
        self._local = threading.local()
        self._lock = threading.Lock()  # the writer's connection is used by one thread at once

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
            for table in ("records", "corpora", "seen"):
                db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute(
            "CREATE TABLE IF NOT EXISTS corpora (id INTEGER PRIMARY KEY, org VARCHAR, "
            "project VARCHAR, corpus VARCHAR, cursor VARCHAR, lines BIGINT)"
        )
        db.execute(f"CREATE TABLE IF NOT EXISTS records ({_RECORD_COLUMNS})")
        # Who labeled or skipped which live trace: the queue's count of what is left.
        db.execute(
            "CREATE TABLE IF NOT EXISTS seen (corpus_id INTEGER, labeler VARCHAR, trace_id VARCHAR)"
        )
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", [SCHEMA_VERSION])
        return db

    def _consistent(self) -> bool:
        rows = self.db.execute(
            "SELECT seg, max(off + len + 1) FROM records WHERE seg IS NOT NULL GROUP BY seg"
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
        with self._lock:
            row = self.db.execute("SELECT cursor FROM corpora WHERE id = ?", [corpus_id]).fetchone()
        if row is None or row[0] is None:
            return None
        return check_cursor(loads(row[0]))

    def reset(self, corpus_id: int) -> None:
        """Forget a corpus's rows and cursor (its history expired under the cursor)."""
        with self._lock, self._transaction():
            self.db.execute("DELETE FROM records WHERE corpus_id = ?", [corpus_id])
            self.db.execute("DELETE FROM seen WHERE corpus_id = ?", [corpus_id])
            self.db.execute("UPDATE corpora SET cursor = NULL, lines = 0 WHERE id = ?", [corpus_id])

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- ingest (one writer thread) ------------------------------------------------------

    def ingest(self, corpus_id: int, data: bytes, cursor: Cursor) -> None:
        """Take verified corpus lines (one buffer, each line ending with a newline) and the
        cursor after them (see the module)."""
        with self._lock:
            if not data:
                self.db.execute(
                    "UPDATE corpora SET cursor = ? WHERE id = ?",
                    [dumps(cursor).decode(), corpus_id],
                )
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
                try:
                    self._apply(corpus_id, segment, path, _Slice(offsets, lengths, data, begin),
                                cursor if last == lines else None)  # fmt: skip
                except duckdb.Error as exc:
                    path.unlink(missing_ok=True)
                    raise IndexError_(f"DuckDB could not take the batch: {exc}") from exc
                except IndexError_:
                    path.unlink(missing_ok=True)
                    raise

    def _apply(
        self, corpus_id: int, segment: int, path: Path, lines: _Slice, cursor: Cursor | None
    ) -> None:
        columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in _COLUMNS.items()) + "}"
        source = (
            f"read_json('{path}', format = 'newline_delimited', "
            f"columns = {columns}, maximum_object_size = 268435456)"
        )
        count = len(lines.offsets)
        db = self.db
        with self._transaction():
            # 2. The columns, a row per line in the file's order; then where each line is.
            # In a transaction the new rows' rowids start at a base of its own, in the order
            # they were inserted: rowid - base is the line's place in the slice.
            db.execute(f"CREATE OR REPLACE TEMP TABLE lines AS SELECT {_EXTRACT} FROM {source}")
            first = db.execute("SELECT min(rowid) FROM lines").fetchone()
            db.execute(
                "CREATE OR REPLACE TEMP TABLE batch AS SELECT l.*, o._o, o._n FROM lines l "
                "JOIN (SELECT unnest(?::BIGINT[]) AS _o, unnest(?::BIGINT[]) AS _n, "
                "generate_subscripts(?::BIGINT[], 1) - 1 + ? AS row) o ON l.rowid = o.row",
                [lines.offsets, lines.lengths, lines.offsets, first[0] if first else 0],
            )
            self._check_order(lines)
            db.execute("DROP TABLE lines")
            # 3. The best line per trace, the rows it replaces, the traces that have none.
            repeated = db.execute("SELECT count(*) - count(DISTINCT trace_id) FROM batch")
            row = repeated.fetchone()
            if row is not None and row[0]:  # a trace twice in the slice: keep its best line
                db.execute(
                    "DELETE FROM batch WHERE _o NOT IN (SELECT _o FROM batch QUALIFY "
                    "row_number() OVER (PARTITION BY trace_id ORDER BY revision DESC, "
                    "deleted DESC, _o) = 1)"
                )
            db.execute(
                "DELETE FROM records USING batch b WHERE records.corpus_id = ? "
                "AND records.trace_id = b.trace_id AND (b.revision > records.revision OR "
                "(b.revision = records.revision AND b.deleted AND NOT records.deleted))",
                [corpus_id],
            )
            # seq: the segment's number, then the place in it: the order lines were read.
            db.execute(
                "INSERT INTO records SELECT ?, trace_id, revision, deleted, reward, passed, "
                "labels_count, agent_version, scenario, updated_at, completed_at, max_severity, "
                "pass_dims, labelers, skipped_by, (?::BIGINT << 40) + _o, "
                "CASE WHEN deleted THEN NULL ELSE ? END, _o, _n, labeled, bucket, completed_us, "
                "spread, labels, results, pass_threshold, eval_reward, eval_passed, eval_split "
                "FROM batch b WHERE NOT EXISTS (SELECT 1 FROM records r WHERE r.corpus_id = ? "
                "AND r.trace_id = b.trace_id)",
                [corpus_id, segment, segment, corpus_id],
            )
            # The rows this slice made (its seq range) decide who has seen those traces.
            low, high = segment << 40, (segment + 1) << 40
            db.execute(
                "DELETE FROM seen WHERE corpus_id = ? AND trace_id IN (SELECT trace_id FROM "
                "records WHERE corpus_id = ? AND seq >= ? AND seq < ?)",
                [corpus_id, corpus_id, low, high],
            )
            db.execute(
                "INSERT INTO seen SELECT corpus_id, unnest(list_distinct(labelers || "
                "skipped_by)), trace_id FROM records WHERE corpus_id = ? AND seq >= ? "
                "AND seq < ? AND NOT deleted",
                [corpus_id, low, high],
            )
            if cursor is None:
                db.execute("UPDATE corpora SET lines = lines + ? WHERE id = ?", [count, corpus_id])
            else:
                db.execute(
                    "UPDATE corpora SET cursor = ?, lines = lines + ? WHERE id = ?",
                    [dumps(cursor).decode(), count, corpus_id],
                )
            db.execute("DROP TABLE batch")

    def _check_order(self, lines: _Slice) -> None:
        """Step 2's guard: DuckDB read as many rows as there are lines, each got a place, and
        rows taken across the slice name the trace their line starts with (a record's first
        key): were the rows not in the file's order, the lines would not match."""
        count = len(lines.offsets)
        found = self.db.execute("SELECT (SELECT count(*) FROM lines), count(*) FROM batch")
        counts = found.fetchone()
        if counts is None or counts[0] != count or counts[1] != count:
            raise IndexError_(f"DuckDB read {counts} rows from a slice of {count} lines")
        picks = sorted({0, count - 1, *range(0, count, max(count // CHECKED_ROWS, 1))})
        rows = self.db.execute(
            "SELECT _o, trace_id FROM batch WHERE list_contains(?::BIGINT[], _o)",
            [[lines.offsets[n] for n in picks]],
        ).fetchall()
        if len(rows) != len(picks):
            raise IndexError_(f"{len(rows)} of {len(picks)} checked rows found in the slice")
        for offset, trace_id in rows:
            start = lines.begin + int(offset)
            head = b'{"trace_id":' + orjson.dumps(trace_id)
            if lines.data[start : start + len(head)] != head:
                raise IndexError_(
                    f"the row at offset {offset} is not its line (DuckDB changed the order?)"
                )

    def collect_segments(self) -> list[int]:
        """Delete the segments no row points into; return them."""
        with self._lock:
            rows = self.db.execute(
                "SELECT DISTINCT seg FROM records WHERE seg IS NOT NULL"
            ).fetchall()
            return self.segments.remove({int(r[0]) for r in rows})

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
        with self._lock:
            live = self.db.execute(
                "SELECT corpus_id, seg, sum(len + 2) FROM records WHERE seg IS NOT NULL "
                "GROUP BY ALL ORDER BY corpus_id, seg"
            ).fetchall()
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
        rows = self.db.execute(
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
                with self._transaction():
                    self.db.execute(
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

    def reader(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor on the index (queries run on any thread)."""
        cursor: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._local.cursor = self.db.cursor()
        return cursor

    def live_counts(self) -> dict[int, int]:
        """Live records per corpus id."""
        rows = (
            self.reader()
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
            self.reader()
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
            self.reader()
            .execute(
                f"SELECT seg, off, len FROM ({sql}) ORDER BY seq LIMIT ? OFFSET ?",
                [*params, limit, offset],
            )
            .fetchall()
        )
        return self.bodies_at(rows)

    def bodies_at(self, rows: list[tuple[Any, ...]]) -> list[bytes]:
        """The bodies at (segment, offset, length) places."""
        return self.segments.read_many([(int(s), int(o), int(n)) for s, o, n in rows])

    def has_trace(self, corpus_id: int, trace_id: str) -> bool:
        """Whether the corpus holds a live record of the trace."""
        sql = "SELECT 1 FROM records WHERE corpus_id = ? AND trace_id = ? AND NOT deleted"
        row = self.reader().execute(sql + " LIMIT 1", [corpus_id, trace_id]).fetchone()
        return row is not None
