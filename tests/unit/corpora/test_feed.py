"""The change feed (corpora/feed.py): a message per corpus commit, at least once.

The sink's partition is fed real join snapshots into a MemoryStore, with a producer that
records what it is asked to send (and can refuse), so the messages, their counts and what
a restart announces again are checked without a broker.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from rl_export.corpora.chain import SinkConfig
from rl_export.corpora.feed import Feed, compaction_message
from rl_export.corpora.partition import PartitionSink
from rl_export.corpora.store import MemoryStore
from rl_export.formats.specs import DEFAULT_CORPORA
from rl_export.model.codec import loads
from rl_export.runtime.metrics import SinkMetrics
from tests.unit.corpora.test_sink import EVALUATOR, PARTITION, STREAM, TOPIC, TRACES, Trace, feed


class Producer:
    """What a feed's producer was asked to send; ``refuse`` makes every send fail."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.refuse = False

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.refuse:
            done.set_exception(OSError("the broker is away"))
        else:
            self.sent.append((topic, key, value))
            done.set_result(None)
        return done


def partition(store: MemoryStore, producer: Producer) -> tuple[PartitionSink, Feed]:
    metrics = SinkMetrics(CollectorRegistry())
    the_feed = Feed("corpus.commits", lambda: producer, metrics)  # type: ignore[arg-type,return-value]
    sink = PartitionSink(
        store=store, topic=TOPIC, partition=PARTITION, specs=DEFAULT_CORPORA,
        config=SinkConfig(), metrics=metrics, writer="w", feed=the_feed,
    )  # fmt: skip
    return sink, the_feed


def messages(producer: Producer) -> list[tuple[str, dict[str, Any]]]:
    return [(key.decode(), loads(value)) for topic, key, value in producer.sent
            if topic == "corpus.commits"]  # fmt: skip


async def test_every_commit_is_announced_with_its_counts_and_position() -> None:
    store, producer = MemoryStore(), Producer()
    sink, the_feed = partition(store, producer)
    a, b = Trace("tr-a"), Trace("tr-b")
    await feed(sink, [(0, a.completed()), (1, b.completed()), (2, a.evaluated())])
    assert await sink.flush() == 3
    assert await the_feed.flush()
    await feed(sink, [(3, b.evaluated()), (4, a.evaluated(score=0.5))])  # a re-score
    await sink.flush()
    await the_feed.flush()

    got = messages(producer)
    by_corpus: dict[str, list[dict[str, Any]]] = {}
    for key, message in got:
        by_corpus.setdefault(key, []).append(message)
    traces = by_corpus[TRACES.root]
    assert [(m["records"], m["new_records"]) for m in traces] == [(3, 2), (2, 0)]
    assert [m["position"] for m in traces] == [
        {"generation": None, "chains": {STREAM: 3}}, {"generation": None, "chains": {STREAM: 5}},
    ]  # fmt: skip
    evaluator = by_corpus[EVALUATOR.root]
    assert [(m["records"], m["new_records"]) for m in evaluator] == [(1, 1), (2, 1)]
    for message in traces + evaluator:
        assert message["kind"] == "commit"
        assert message["delta_version"] is None
        assert {message["org"], message["project"]} == {"acme", "bot"}
        assert message["max_updated_at"] is not None


async def test_a_refused_flush_keeps_its_messages_for_the_next() -> None:
    store, producer = MemoryStore(), Producer()
    sink, the_feed = partition(store, producer)
    await feed(sink, [(0, Trace("tr-a").completed())])
    await sink.flush()

    producer.refuse = True
    assert not await the_feed.flush()
    assert the_feed.waiting == 1
    producer.refuse = False
    assert await the_feed.flush()
    assert [key for key, _ in messages(producer)] == [TRACES.root]


async def test_a_restart_announces_again_the_commits_it_reads_again() -> None:
    """A crash after the commits and before the offset: the next sink reads from the group
    offset, and each chain, as it loads, announces its commits from there on (at least
    once); the commits before the group offset are not announced again."""
    store, producer = MemoryStore(), Producer()
    sink, the_feed = partition(store, producer)
    a, b = Trace("tr-a"), Trace("tr-b")
    await feed(sink, [(0, a.completed())])
    await sink.flush()  # offsets 0..0, then the group offset 1 committed
    await feed(sink, [(1, b.completed()), (2, b.evaluated())])
    await sink.flush()  # offsets 1..2 committed in the store; the process dies here
    assert await the_feed.flush()
    before = len(messages(producer))

    restarted, again = partition(store, producer)
    await feed(restarted, [(1, b.completed()), (2, b.evaluated()), (3, a.evaluated())])
    await again.flush()  # what the chains announced as they loaded

    repeated = messages(producer)[before:]
    assert sorted((k, m["position"]["chains"][STREAM]) for k, m in repeated) == [
        (EVALUATOR.root, 3), (TRACES.root, 3),
    ]  # fmt: skip
    assert await restarted.flush() == 4
    await again.flush()
    assert {m["position"]["chains"][STREAM] for _, m in messages(producer)[before + 2 :]} == {4}


def test_a_compaction_message_names_its_generation_and_delta_version() -> None:
    from rl_export.corpora.compacted import Compaction
    from rl_export.corpora.layout import CorpusRef

    compaction = Compaction(
        generation=4, positions={"t-1": 9, "t-0": 7}, parts=[], records=12, schema_version=3,
        created_at="2026-01-01T00:00:00Z", writer="w",
    )  # fmt: skip
    message = compaction_message(CorpusRef("o", "p", "c"), compaction, 17, 5)
    assert message == {
        "org": "o", "project": "p", "corpus": "c", "kind": "compaction",
        "position": {"generation": 4, "chains": {"t-0": 7, "t-1": 9}}, "records": 12,
        "new_records": 5, "max_updated_at": None, "delta_version": 17,
        "created_at": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    assert compaction_message(CorpusRef("o", "p", "c"), compaction, None, None)[
        "delta_version"] is None  # fmt: skip
