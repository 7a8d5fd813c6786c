"""The worker's compaction schedule (worker/main.py): a corpus is compacted once the sink has
made enough commits to it (counted as they are made, no listing), or once it has waited too
long; a quiet corpus costs no store request until then."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from rl_export.corpora.chain import SinkConfig
from rl_export.corpora.compacted import latest_compaction
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.sink import Sink
from rl_export.corpora.store import LocalStore
from rl_export.kafka.client import KafkaConnection
from rl_export.model.snapshots import encode_snapshot
from rl_export.runtime.metrics import SinkMetrics
from rl_export.runtime.settings import Settings
from rl_export.worker.main import compact_corpora
from tests.unit.corpora.test_sink import ORG, PROJECT, Trace

TRACES = CorpusRef(ORG, PROJECT, "traces")


class Counted(LocalStore):
    """A local store that counts its listings."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.lists = 0

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        self.lists += 1
        return await super().list(prefix, start_after)

    async def folders(self, prefix: str) -> list[str]:
        self.lists += 1
        return await super().folders(prefix)


async def commit(sink: Sink, offset: int, trace: str) -> None:
    part = sink._part(0)
    await part.handle(offset, encode_snapshot(Trace(trace).completed())[0], None)
    await part.flush()


async def test_a_corpus_is_compacted_once_its_tail_is_worth_it(tmp_path: Path) -> None:
    store = Counted(tmp_path)
    settings = Settings(partitions=1, compaction_min_commits=3, compaction_max_wait_s=3600,
                        tables=False, store_url=str(tmp_path))  # fmt: skip
    sink = Sink(kafka=KafkaConnection("127.0.0.1:1"), topic="trajectories", group="g",
                store=store, metrics=SinkMetrics(CollectorRegistry()),
                config=SinkConfig(partitions=1))  # fmt: skip
    waiting: dict[CorpusRef, float] = {}
    await commit(sink, 0, "tr-a")
    await commit(sink, 1, "tr-b")
    assert sink.tail_commits()[TRACES] == 2
    listed = store.lists
    await compact_corpora(sink, settings, waiting)
    assert store.lists == listed  # two commits: not worth it, and nothing asked of the store
    assert await latest_compaction(store, TRACES) is None

    await commit(sink, 2, "tr-c")
    await compact_corpora(sink, settings, waiting)
    made = await latest_compaction(store, TRACES)
    assert made is not None
    assert made.records == 3
    assert sink.tail_commits()[TRACES] == 0  # counted afresh

    await commit(sink, 3, "tr-d")  # one commit, but it has waited long enough
    waiting[TRACES] = -1e9
    await compact_corpora(sink, settings, waiting)
    made = await latest_compaction(store, TRACES)
    assert made is not None
    assert made.records == 4


async def test_a_compaction_is_announced_with_its_table_s_delta_version(tmp_path: Path) -> None:
    from rl_export.corpora.feed import Feed
    from rl_export.model.codec import loads
    from tests.unit.corpora.test_feed import Producer

    producer = Producer()
    metrics = SinkMetrics(CollectorRegistry())
    feed = Feed("corpus.commits", lambda: producer, metrics)  # type: ignore[arg-type,return-value]
    store = LocalStore(tmp_path)
    settings = Settings(partitions=1, compaction_min_commits=1, store_url=str(tmp_path))
    sink = Sink(
        kafka=KafkaConnection("127.0.0.1:1"), topic="trajectories", group="g", store=store,
        metrics=metrics, config=SinkConfig(partitions=1), feed=feed,
    )  # fmt: skip
    await commit(sink, 0, "tr-a")
    await compact_corpora(sink, settings)
    sent = [loads(value) for _, key, value in producer.sent if key == TRACES.root.encode()]
    compactions = [m for m in sent if m["kind"] == "compaction"]
    assert len(compactions) == 1
    assert compactions[0]["position"]["generation"] == 1
    assert compactions[0]["delta_version"] is not None  # the table written at generation 1
    assert compactions[0]["records"] == compactions[0]["new_records"] == 1
