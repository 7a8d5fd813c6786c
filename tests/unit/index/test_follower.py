"""The indexer: every followed corpus is written by the index's writer threads, however many
corpora there are, and a corpus read again (a body's object expired) is reset only after the
writes of the reading it replaces."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import LocalStore
from rl_export.index.follower import Followed, Indexer
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.runtime.metrics import WebMetrics
from tests.exportdata import ORG, PROJECT, build_story

SOURCES = ("human", "evaluator", "traces")


async def live_records(store: LocalStore, corpus: str) -> int:
    """The corpus's live traces by the reader's rule: the greatest revision, a tombstone on
    a tie."""
    best: dict[str, tuple[int, bool]] = {}
    async for value in CorpusReader(store, CorpusRef(ORG, PROJECT, corpus)).records():
        mark = (int(value["revision"]), bool(value.get("deleted")))
        best[value["trace_id"]] = max(best.get(value["trace_id"], mark), mark)
    return sum(not deleted for _, deleted in best.values())


async def passes_beyond(followed: Followed, passes: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while followed.restarting or followed.passes <= passes:
        assert time.monotonic() < deadline, f"{followed.key.name}: no pass after {passes}"
        await asyncio.sleep(0.05)


def writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("rl-export-index-writer")}


async def test_corpora_share_the_writers_and_a_corpus_read_again_ends_the_same(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store")
    await build_story(store)
    expected = [await live_records(store, corpus) for corpus in SOURCES]
    assert all(expected)
    index = QueryIndex(tmp_path / "index", writers=1)
    indexer = Indexer(index, LocalStore(tmp_path / "store"), WebMetrics(CollectorRegistry()),
                      poll_interval_s=0.05)  # fmt: skip
    before = writer_threads()
    indexer.start()
    try:
        followed = [await indexer.ready(CorpusKey(ORG, PROJECT, c), 30) for c in SOURCES]
        for one in followed:
            await passes_beyond(one, 0)
        assert [one.live for one in followed] == expected
        assert len(writer_threads() - before) == 1  # three corpora, one writer

        # Read one corpus again from its latest compaction while the others go on: the
        # reset waits for the writes already asked for, and the corpus ends as it was.
        human = followed[0]
        assert human.corpus_id is not None
        passes = human.passes
        assert index.gone is not None
        index.gone(human.corpus_id)
        await passes_beyond(human, passes + 1)
        assert [one.live for one in followed] == expected
        assert [one.error for one in followed] == [None, None, None]
    finally:
        indexer.stop()
        index.close()
