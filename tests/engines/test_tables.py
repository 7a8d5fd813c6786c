"""Spark, Polars and pandas read the corpora's open tables and find our latest view, row for
row: after a backfill, new traffic, re-scores and a deletion, and at pinned versions.

The steps build on each other (one corpus, module-scoped), in this file's order:

1. a backfill: twelve traces, evaluated, some labeled;
2. new traffic and re-scores: six new traces, three traces evaluated again;
3. a deletion: two traces deleted, one label retracted;

each followed by ``rl-export shards compact``, and each table read by the three engines and
compared with ``rl-export export`` (:func:`tests.tablecheck.differences`). A version pinned
after step 1 is read at its Delta version after step 2; after step 3 no Delta version of
any table returns a deleted trace (a version from before the deletion cannot be read at all:
its files are gone), and a version pinned then reads right again.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from rl_export.corpora.tablerows import TRAJECTORY_FIELDS
from tests.engines.conftest import CORPORA, Corpus
from tests.factories import event
from tests.records import trace_events
from tests.tablecheck import differences

RUBRIC = {"correctness": 4, "helpfulness": 3, "efficiency": 5, "safety": 4}
DELETED = ("tr-004", "tr-013")


def spark_rows(spark: Any, corpus: Corpus, name: str, version: int | None = None) -> list[Any]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return [row.asDict() for row in reader.load(corpus.table(name, "s3a")).collect()]


def polars_rows(corpus: Corpus, name: str, version: int | None = None) -> list[Any]:
    import polars as pl

    frame = pl.read_delta(corpus.table(name), version=version,
                          storage_options=corpus.storage_options)  # fmt: skip
    rows: list[Any] = frame.to_dicts()
    return rows


def pandas_rows(corpus: Corpus, name: str, version: int | None = None) -> list[Any]:
    """pandas through deltalake: its query engine (``to_pandas()`` on an S3 table can abort
    the interpreter at exit, delta-rs #2184; the query path does not)."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(corpus.table(name), version=version, storage_options=corpus.storage_options)
    result = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
    rows: list[Any] = pa.table(result).to_pandas().to_dict("records")
    return rows


def check_engines(spark: Any, corpus: Corpus, name: str, *, version: str | None = None,
                  delta_version: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Every engine's rows equal our view (``version``: a pinned one, read at its Delta
    version); the view, returned."""
    view = corpus.view(name, version)
    for engine, rows in (
        ("spark", spark_rows(spark, corpus, name, delta_version)),
        ("polars", polars_rows(corpus, name, delta_version)),
        ("pandas", pandas_rows(corpus, name, delta_version)),
    ):
        columns = list(rows[0]) if rows else list(TRAJECTORY_FIELDS)
        assert set(TRAJECTORY_FIELDS) <= set(columns), (engine, columns)
        assert differences(rows, view, columns) == [], (engine, name, version)
    return view


def backfill() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for n in range(1, 13):
        labels = (RUBRIC, {**RUBRIC, "safety": 2}) if n % 3 == 0 else ()
        events += trace_events(n, score=0.07 * n, passed=n % 2 == 0, minute=n, labels=labels,
                               scenario="refund" if n < 7 else "shipping")  # fmt: skip
    return events


def rescore(n: int, score: float) -> dict[str, Any]:
    """A second evaluation of ``tr-<n>``, later: it replaces the first."""
    trace_id = f"tr-{n:03d}"
    return event("evaluation.finished", f"{trace_id}-e2", f"2026-01-02T00:{n:02d}:00Z",
                 trace_id=trace_id, evaluation_id=f"ev-{n}-again",
                 results=[{"evaluator": "judge", "score": score, "passed": score >= 0.7,
                           "reasoning": "looked again"}])  # fmt: skip


PINNED: dict[str, dict[str, Any]] = {}


def test_after_a_backfill_every_engine_reads_the_latest_view(spark: Any, corpus: Corpus) -> None:
    corpus.add(backfill())
    for name in CORPORA:
        view = check_engines(spark, corpus, name)
        assert view, name
        PINNED[name] = corpus.pin(name, "after-backfill")
        assert PINNED[name]["delta_version"] is not None


def test_after_new_traffic_and_re_scores_too(spark: Any, corpus: Corpus) -> None:
    events: list[dict[str, Any]] = []
    for n in range(13, 19):
        events += trace_events(n, score=0.05 * n, passed=n % 2 == 1, minute=n,
                               labels=(RUBRIC,) if n == 15 else ())  # fmt: skip
    events += [rescore(2, 0.95), rescore(5, 0.1), rescore(9, 0.75)]
    corpus.add(events)
    for name in CORPORA:
        view = check_engines(spark, corpus, name)
        if name == "evaluator":  # the re-score is the record's reward now
            assert {r["trace_id"]: r["reward"] for r in view}["tr-002"] == pytest.approx(0.95)


def test_a_pinned_version_reads_at_its_delta_version(spark: Any, corpus: Corpus) -> None:
    for name in CORPORA:
        pinned = PINNED[name]
        check_engines(spark, corpus, name, version=pinned["name"],
                      delta_version=pinned["delta_version"])  # fmt: skip


def test_after_a_deletion_no_version_returns_the_deleted_traces(spark: Any, corpus: Corpus) -> None:
    events = [event("trace.deleted", f"{t}-d", "2026-01-03T00:00:00Z", trace_id=t)
              for t in DELETED]  # fmt: skip
    events.append(event("label.retracted", "tr-003-r", "2026-01-03T00:00:01Z",
                        trace_id="tr-003", labeler="labeler-0"))  # fmt: skip
    corpus.add(events)
    for name in CORPORA:
        view = check_engines(spark, corpus, name)
        assert not {r["trace_id"] for r in view} & set(DELETED)
        latest = corpus.pin(name, "after-deletion")
        check_engines(spark, corpus, name, version="after-deletion",
                      delta_version=latest["delta_version"])  # fmt: skip
        for version in range(latest["delta_version"] + 1):
            try:
                rows = polars_rows(corpus, name, version)
            except Exception:  # a version before the deletion: its files are gone
                continue
            assert not {r["trace_id"] for r in rows} & set(DELETED), (name, version)
        before = PINNED[name]["delta_version"]
        with pytest.raises(Exception, match=r"(?i)not.?found|FILE_NOT_EXIST|No such file"):
            spark_rows(spark, corpus, name, before)  # read, not counted: see the guide
