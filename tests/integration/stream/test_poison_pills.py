"""A poison pill for every stage, on the real broker: the record behind it arrives.

- The join: an event larger than the dead-letter topic takes (the input topic was made to
  take 1 MiB, the dead-letter topic the 256 KiB the worker asks of it for a 64 KiB event
  limit): the broker refuses its dead letter, a reference goes instead, and the trace's own
  events behind it on the same partition are joined.
- The sink: a record on ``trajectories`` whose org cannot name a folder, ahead of a trace's
  snapshot on the same partition: skipped and counted, the snapshot committed.
- The web service's tails of the labels and claims topics: records their readers do not
  survive (a claim entry whose generation is a string, JSON of other shapes, bytes), ahead of
  a label and a claim that must reach the overlay and the claim book.

Before this, the join retried the refused batch forever, the store refused ``..`` at every
flush of the sink, and the claims tail's task died on the first entry it could not decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import open_store
from rl_export.labeling.claims import SlotEntry
from rl_export.model.partitioning import partition_function
from rl_export.runtime.settings import Settings
from rl_export.stream.deadletters import HEADER_REFERENCE, REFERENCE_HEAD_BYTES
from rl_export.stream.topics import TopicSpec, ensure_service_topics, ensure_topics, topic_specs
from rl_export.web.services import build_services
from tests.factories import event
from tests.integration.workers import TopicReader, WorkerProcess
from tests.records import trace_events

LIMIT = 64 * 1024  # RL_EXPORT_MAX_EVENT_BYTES: the dead-letter topic then takes 256 KiB


async def send(settings: Settings, records: list[tuple[str, int, bytes | None, bytes]]) -> None:
    """(topic, partition, key, value), in order, acknowledged one by one."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap,
                                max_request_size=2 * 1024 * 1024)  # fmt: skip
    await producer.start()
    try:
        for topic, partition, key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


async def traces_in_corpus(settings: Settings) -> set[str]:
    store = open_store(settings.store_url)
    try:
        reader = CorpusReader(store, CorpusRef("acme", "bot", "traces"))
        return {r["trace_id"] async for r in reader.records(latest_only=True)}
    except Exception:  # nothing committed yet
        return set()
    finally:
        await store.close()


async def test_the_join_and_the_sink_pass_their_poison_pills(settings: Settings) -> None:
    settings = settings.model_copy(update={"max_event_bytes": LIMIT, "join_processes": 1,
                                           "shard_max_age_s": 1.0})  # fmt: skip
    specs = topic_specs(settings)  # as the worker makes them, but the input topics take 1 MiB
    for spec in specs:
        bigger = TopicSpec(spec.name, spec.partitions, {"max.message.bytes": str(1 << 20)})
        await ensure_topics(settings.kafka_bootstrap,
                            [bigger if spec.name in settings.input_topics else spec])  # fmt: skip
    partition_of = partition_function(settings.partitioner)
    home = {t: partition_of(t.encode(), settings.partitions) for t in ("tr-000", "tr-001")}
    # Not even JSON, larger than anything but its topic takes, and random: the producer's
    # compression must not shrink it below the dead-letter topic's limit.
    poison = b"{" + os.urandom(400_000)
    unnamable = orjson.dumps({"trace_id": "tr-x", "org": "..", "project": "bot",
                              "revision": 1, "deleted": True})  # fmt: skip
    joined = [(settings.topic_traces if e["event_type"] == "trace.completed"
               else settings.topic_evaluations, home[e["trace_id"]], e["trace_id"].encode(),
               orjson.dumps(e))
              for n in (0, 1) for e in trace_events(n, score=0.9, passed=True)]  # fmt: skip
    await send(settings, [
        (settings.topic_traces, home["tr-000"], b"tr-000", poison),
        (settings.topic_trajectories, home["tr-001"], b"tr-x", unnamable),
        *joined,
    ])  # fmt: skip
    worker = WorkerProcess(settings, "worker").start()
    try:
        deadline = time.monotonic() + 120
        while await traces_in_corpus(settings) != {"tr-000", "tr-001"}:
            assert time.monotonic() < deadline, "the traces behind the poison pills never came"
            await asyncio.sleep(0.5)
        assert worker.metric("rl_export_dead_letter_references_total", reason="oversized") == 1
        assert worker.metric("rl_export_sink_bad_snapshots_total") == 1
        assert worker.ready()
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert "Traceback" not in log  # nor "Future exception was never retrieved"
    assert "they go as references" in log
    dead = await TopicReader(settings, settings.topic_dead_letter).read_until(lambda r: len(r) >= 1)
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert dead[0].value == poison[:REFERENCE_HEAD_BYTES]
    assert headers[HEADER_REFERENCE] == str(len(poison)).encode()
    assert headers["rl-export-reason"] == b"oversized"
    assert headers["rl-export-source-topic"] == settings.topic_traces.encode()
    assert headers["rl-export-source-partition"] == str(home["tr-000"]).encode()
    assert headers["rl-export-source-offset"] == b"0"


def claim(trace: str, **changes: Any) -> dict[str, Any]:
    entry = {"org": "acme", "project": "bot", "trace_id": trace, "slot": 0,
             "generation": 1, "state": "claimed", "holder": "ana", "at": time.time(),
             "expires_at": time.time() + 600}  # fmt: skip
    return entry | changes


async def test_the_web_service_tails_pass_their_poison_pills(settings: Settings) -> None:
    await ensure_service_topics(settings)
    poisons = [
        b"\xff\xfe not json",
        orjson.dumps([1, 2]),
        orjson.dumps({"org": "acme"}),
        orjson.dumps(claim("tr-bad", generation="one")),  # TypeError in its decoding
        orjson.dumps(claim("tr-bad", trace_id=["a", "list"])),
    ]  # unhashable: TypeError
    label = event("label.submitted", "l-behind", trace_id="tr-behind", labeler="bo")
    valid = SlotEntry(**claim("tr-behind"))  # type: ignore[arg-type]
    await send(settings, [
        *[(topic, 0, b"k", p) for p in poisons
          for topic in (settings.topic_labels, settings.topic_claims)],
        (settings.topic_labels, 0, b"tr-behind", orjson.dumps(label)),
        (settings.topic_claims, 0, b"tr-behind", valid.encode()),
    ])  # fmt: skip
    services = build_services(settings)
    stop = asyncio.Event()
    tails = [asyncio.create_task(tail.run(stop))
             for tail in (services._labels_tail(), services._claims_tail())]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ("bo" in services.overlay.fresh("acme", "bot").get("tr-behind", {})
                   and services.claim_book.slots("acme", "bot", "tr-behind")):  # fmt: skip
            assert time.monotonic() < deadline, "the label and claim behind never came"
            assert not any(t.done() for t in tails), [t.exception() for t in tails if t.done()]
            await asyncio.sleep(0.2)
        assert services.claim_book.slots("acme", "bot", "tr-behind") == {0: valid}
        skipped = services.registry.get_sample_value
        assert skipped("rl_export_web_tail_skipped_total", {"topic": "claims"}) == 2
    finally:
        stop.set()
        for task in tails:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
        services.index.close()
        await services.store.close()
        await services.indexer.store.close()
