"""``make bench-eos``: the exactly-once loop in aiokafka and in confluent-kafka, side by side.

Issue 45 allows moving the worker's Kafka I/O to confluent-kafka (librdkafka) if a prototype
of the transactional consume-transform-produce loop is at least 1.5 times as fast on the
same broker. This is that prototype, measured the way ``make bench`` measures the worker:

1. Start the local broker and produce the small shape's backlog (0.7 KiB events, three
   tenants, 2 % repeats) to input topics of its own, eight partitions each.
2. Each client, in a child process of its own, runs the loop the join runs: poll a batch;
   per record, the same transform (parse with orjson, add a field, serialize: the join's
   decode and encode at their cheapest); produce each output to an output topic, keyed by
   trace, inside a transaction that also commits the consumed offsets for the group
   (``send_offsets_to_transaction``); commit; repeat until the backlog is consumed. A
   transaction per poll of at most ``--batch`` records (the join's batch), idempotent,
   ``acks=all``.
3. Timed from the first record to the last commit; CPU of the child (user + system) per
   event. Interleaved rounds, fresh groups and output topics each; medians, and the
   Mann-Whitney test of :mod:`tests.perf.significance` on the rates.

A bare consumer of each client (the same parse, no produce) is measured too, the ceiling of
each. The output is checked: as many committed records as input records, read back with
``read_committed`` (a loop that loses or doubles records is not a faster one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import SHAPES
from rl_export.runtime.net import free_port
from tests.perf.bench import bench_settings, own_topics, produce_backlog
from tests.perf.significance import compare, verdict

CLIENTS = ("aiokafka", "confluent")
GOAL_RATIO = 1.5  # confluent-kafka's loop against aiokafka's (issue 45)


def log(message: str) -> None:
    print(f"[bench-eos {datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def transform(value: bytes) -> bytes:
    """The same work per record in both loops."""
    event = orjson.loads(value)
    event["seen"] = True
    return orjson.dumps(event)


@dataclass(frozen=True)
class Loop:
    """One loop's run: where it reads and writes, how much, and whether it produces."""

    bootstrap: str
    topics: list[str]
    out: str
    group: str
    total: int
    batch: int
    produce: bool


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _aiokafka_loop(loop: Loop) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    bootstrap, group, out, total, produce = (loop.bootstrap, loop.group, loop.out, loop.total,
                                             loop.produce)  # fmt: skip
    consumer = AIOKafkaConsumer(
        *loop.topics, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, isolation_level="read_committed", max_poll_records=loop.batch,
    )  # fmt: skip
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{group}-tx", enable_idempotence=True,
        acks="all", linger_ms=5, max_batch_size=512 * 1024,
    ) if produce else None  # fmt: skip
    await consumer.start()
    if producer is not None:
        await producer.start()
    seen, first, cpu = 0, 0.0, 0.0
    try:
        while seen < total:
            found = await consumer.getmany(timeout_ms=200)
            if not found:
                continue
            if not first:
                first, cpu = time.perf_counter(), _cpu()
            if producer is None:
                for records in found.values():
                    for r in records:
                        transform(r.value)
                    seen += len(records)
                continue
            async with producer.transaction():
                for records in found.values():
                    for r in records:
                        await producer.send(out, transform(r.value), key=r.key)
                    seen += len(records)
                offsets = {tp: records[-1].offset + 1 for tp, records in found.items()}
                await producer.send_offsets_to_transaction(offsets, group)
        done, cpu = time.perf_counter(), _cpu() - cpu
    finally:
        await consumer.stop()
        if producer is not None:
            await producer.stop()
    return {"seconds": done - first, "cpu_s": cpu}


def _confluent_loop(loop: Loop) -> dict[str, float]:
    from confluent_kafka import Consumer, Producer

    bootstrap, group, out, total, produce = (loop.bootstrap, loop.group, loop.out, loop.total,
                                             loop.produce)  # fmt: skip
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "isolation.level": "read_committed",
    })  # fmt: skip
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": f"{group}-tx",
        "enable.idempotence": True, "acks": "all", "linger.ms": 5,
    })  # fmt: skip
    consumer.subscribe(loop.topics)
    if produce:
        producer.init_transactions()
    seen, first, cpu = 0, 0.0, 0.0
    try:
        while seen < total:
            found = consumer.consume(num_messages=loop.batch, timeout=0.2)
            found = [m for m in found if m.error() is None]
            if not found:
                continue
            if not first:
                first, cpu = time.perf_counter(), _cpu()
            if not produce:
                for m in found:
                    transform(m.value() or b"{}")
                seen += len(found)
                continue
            producer.begin_transaction()
            for m in found:
                while True:
                    try:
                        producer.produce(out, transform(m.value() or b"{}"), key=m.key())
                        break
                    except BufferError:  # the local queue is full: let it drain
                        producer.poll(0.01)
            seen += len(found)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
            )
            producer.commit_transaction()
        done, cpu = time.perf_counter(), _cpu() - cpu
    finally:
        consumer.close()
    return {"seconds": done - first, "cpu_s": cpu}


def run_loop(client: str, loop: Loop) -> dict[str, float]:
    """One loop in this (child) process."""
    if client == "aiokafka":
        return asyncio.run(_aiokafka_loop(loop))
    return _confluent_loop(loop)


def make_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


def committed(bootstrap: str, topic: str) -> int:
    """The records of ``topic`` that committed transactions hold (read_committed)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
        "isolation.level": "read_committed", "enable.auto.commit": False,
    })  # fmt: skip
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        count = 0
        for p in meta:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            consumer.assign([TopicPartition(topic, p, low)])
            while True:  # control records take offsets: read to the end
                messages = consumer.consume(num_messages=10_000, timeout=1.0)
                count += sum(1 for m in messages if m.error() is None)
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                if not messages or position >= high:
                    break
        return count
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_eos", description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=24_000, help="of the small shape")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2_000, help="records per transaction")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", default="var/bench")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rl-export-bench-eos-"))
    broker = LocalKafka(work / "kafka", free_port(), heap="1g")
    log(f"starting Kafka in {work}")
    broker.start()
    spawn = multiprocessing.get_context("spawn")
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        settings = own_topics(bench_settings(broker.bootstrap, work), "eos")
        events, size, _ = asyncio.run(produce_backlog(settings, SHAPES["small"], args.traces,
                                                      args.seed))  # fmt: skip
        total = len(events)
        topics = list(settings.input_topics)
        for n in range(args.rounds):
            order = CLIENTS if n % 2 == 0 else CLIENTS[::-1]
            for produce in (False, True):
                for client in order:
                    name = f"{client} {'transactional loop' if produce else 'bare consumer'}"
                    out = f"eos-out-{client}-{n}-{int(produce)}"
                    group = f"eos-{client}-{n}-{int(produce)}-{os.getpid()}"
                    if produce:
                        make_topic(broker.bootstrap, out, settings.partitions)
                    loop = Loop(broker.bootstrap, topics, out, group, total, args.batch, produce)
                    with spawn.Pool(1) as pool:
                        got = pool.apply(run_loop, (client, loop))
                    got["rate"] = total / got["seconds"]
                    if produce:
                        got["committed"] = committed(broker.bootstrap, out)
                        if got["committed"] != total:
                            raise SystemExit(f"{name}: {got['committed']} records committed "
                                             f"of {total}")  # fmt: skip
                    runs.setdefault(name, []).append(got)
                    log(f"round {n + 1}: {name}: {got['rate']:,.0f} events/s, "
                        f"{got['cpu_s'] / total * 1e6:.1f} CPU µs/event")  # fmt: skip
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {"at": datetime.now(UTC).isoformat(), "events": total, "bytes": size,
              "batch": args.batch, "runs": runs}  # fmt: skip
    out_dir = Path(args.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"eos-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\n{total:,} small events ({size / total / 1024:.2f} KiB), {args.rounds} rounds, "
          f"medians; a transaction per poll of at most {args.batch} records")  # fmt: skip
    print(f"{'':38} {'events/s':>10} {'CPU µs/event':>13}")
    for name, each in runs.items():
        rate = statistics.median(g["rate"] for g in each)
        cpu = statistics.median(g["cpu_s"] for g in each) / total * 1e6
        print(f"{name:38} {rate:10,.0f} {cpu:13.1f}")
    for kind in ("transactional loop", "bare consumer"):
        fast = [g["rate"] for g in runs[f"confluent {kind}"]]
        slow = [g["rate"] for g in runs[f"aiokafka {kind}"]]
        found = compare(slow, fast)
        goal = ""
        if "loop" in kind:
            goal = f"; goal {GOAL_RATIO} x: {'met' if found['ratio'] >= GOAL_RATIO else 'not met'}"
        print(f"confluent-kafka / aiokafka, {kind}: {found['ratio']:.2f} x, "
              f"{verdict(found)}{goal}")  # fmt: skip
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
