"""``rl-export replay``: the join and the sink over event files, without a broker.

1. Each line of the files is routed like ``produce`` would (topic by ``event_type``,
   partition by murmur2 of the ``trace_id``); lines that cannot be routed are reported.
2. Batches go through the same :class:`~rl_export.stream.processor.JoinProcessor` as the
   worker, with an in-memory table; what it would dead-letter is reported, with the file and
   line.
3. Snapshots go to the same :class:`~rl_export.corpora.partition.PartitionSink` as the stream, on
   chains of their own: topic ``replay-<run id>``, partition = murmur2(trace_id) mod the partition
   count, offsets = a sequence per partition. A backfill never collides with the stream.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from rl_export.corpora.chain import SinkConfig, writer_id
from rl_export.corpora.partition import PartitionSink
from rl_export.corpora.rubrics import RubricVersions
from rl_export.corpora.store import ObjectStore
from rl_export.model.events import EventFamily, EventRejection
from rl_export.model.partitioning import partition_for
from rl_export.model.snapshots import HEADER_RECORD_AT, Headers
from rl_export.runtime.metrics import Metrics, SinkMetrics
from rl_export.runtime.settings import Settings
from rl_export.stream.processor import InMessage, JoinProcessor, MemoryTable
from rl_export.stream.produce import route, topic_for

BATCH = 1000


@dataclass
class ReplayReport:
    """What a replay did."""

    run_id: str
    lines: int = 0
    snapshots: int = 0
    invalid: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "file:line: reason: detail"
    records: dict[str, float] = field(default_factory=dict)  # corpus -> records written

    def reject(self, where: str, reason: str, detail: str) -> None:
        self.invalid[reason] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{where}: {reason}: {detail}")


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


class _Collector:
    """The join's emitter for a replay: snapshots to the replay chains, rejections reported."""

    def __init__(self, report: ReplayReport, where: dict[tuple[str, int, int], str]) -> None:
        self.report = report
        self.where = where
        self.snapshots: list[tuple[bytes, bytes, bytes | None]] = []
        self.forwards: list[InMessage] = []

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers, *, task: int | None = None,
    ) -> None:  # fmt: skip
        self.snapshots.append((key, value, dict(headers).get(HEADER_RECORD_AT)))

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        """Replay routes every line with the configured partitioner, so the join asks this
        only for what it sends other traces (a comparison's mirror or notice): joined again
        on its partition, as the stream would."""
        self.forwards.append(
            InMessage(message.topic, partition, message.offset, key, message.value)
        )

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        where = self.where.get((message.topic, message.partition, message.offset), "?")
        self.report.reject(where, rejection.reason.value, rejection.detail)

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        return None


async def replay(
    settings: Settings,
    store: ObjectStore,
    lines: Iterable[tuple[str, bytes]],
    *,
    run_id: str | None = None,
    progress: Callable[[int], object] | None = None,
) -> ReplayReport:
    """Replay event lines into the corpora of ``store``; return what happened.

    ``progress(n)`` is called with the number of lines of each batch as it is done.
    """
    report = ReplayReport(run_id or new_run_id())
    topic = f"replay-{report.run_id}"
    registry = CollectorRegistry()
    sink_metrics = SinkMetrics(registry)
    config = SinkConfig(
        max_records=settings.shard_max_records,
        max_bytes=settings.shard_max_bytes,
        max_age_s=float("inf"),  # a replay commits by size, and at the end
        compression=settings.shard_compression,
        sidecars=settings.shard_sidecars,
        partitions=settings.partitions,
        partitioner=settings.partitioner,
    )
    writer = writer_id()
    parts = {
        p: PartitionSink(store, topic, p, settings.corpora, config, sink_metrics, writer)
        for p in range(settings.partitions)
    }
    next_offset = dict.fromkeys(parts, 0)
    where: dict[tuple[str, int, int], str] = {}
    collector = _Collector(report, where)
    families = {topic_for(settings, f): f for f in EventFamily}
    processor = JoinProcessor(settings, MemoryTable(), collector, Metrics(registry), families,
                              rubrics=RubricVersions(store))  # fmt: skip
    input_offsets: Counter[tuple[str, int]] = Counter()

    async def run_batch(batch: list[InMessage]) -> None:
        await processor.process(batch, now=time.time())
        for key, value, record_at in collector.snapshots:
            partition = partition_for(key, settings.partitions, settings.partitioner)
            part = parts[partition]
            await part.handle(next_offset[partition], value, None, record_at)
            next_offset[partition] += 1
            report.snapshots += 1
            if part.due(time.monotonic()):
                await part.flush()
        collector.snapshots.clear()
        if progress:
            progress(len(batch))
        forwards, collector.forwards = collector.forwards, []
        if forwards:
            await run_batch(forwards)

    batch: list[InMessage] = []
    for location, line in lines:
        report.lines += 1
        routed = route(line)
        if isinstance(routed, str):
            report.reject(location, "unroutable", routed)
            continue
        family, key = routed
        in_topic = topic_for(settings, family)
        partition = partition_for(key, settings.partitions, settings.partitioner)
        offset = input_offsets[(in_topic, partition)]
        input_offsets[(in_topic, partition)] += 1
        where[(in_topic, partition, offset)] = location
        batch.append(InMessage(in_topic, partition, offset, key, line))
        if len(batch) >= BATCH:
            await run_batch(batch)
            batch = []
    if batch:
        await run_batch(batch)
    for part in parts.values():
        if part.pending_records:
            await part.flush()
    report.records = _written(registry)
    return report


def _written(registry: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in registry.collect():
        if metric.name == "rl_export_sink_records":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["corpus"]] = sample.value
    return out


def summary(report: ReplayReport) -> list[str]:
    """Human-readable lines for the CLI."""
    out = [
        f"replay {report.run_id}: {report.lines} lines, {report.snapshots} snapshots, "
        f"{sum(report.invalid.values())} invalid",
    ]
    out += [f"  {reason}: {count}" for reason, count in sorted(report.invalid.items())]
    out += [f"  e.g. {line}" for line in report.examples[:10]]
    out += [f"  corpus {name}: {int(n)} records" for name, n in sorted(report.records.items())]
    return out
