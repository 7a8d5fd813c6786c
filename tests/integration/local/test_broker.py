"""The local Apache Kafka broker: restarts keep data; a busy port is refused clearly; its
transaction log is small; the bench can see its JIT compiler at work."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from rl_export.local.broker import LocalKafka
from rl_export.model.errors import LocalStackError
from rl_export.runtime.net import free_port
from rl_export.stream.topics import TopicSpec, ensure_topics, partition_counts
from tests.harness.usage import compiler_cpu


def test_the_broker_keeps_its_data_across_a_restart(tmp_path: Path) -> None:
    """A second broker on its own data dir: stop cleanly, start again, topics still there."""
    broker = LocalKafka(tmp_path / "kafka", free_port(), heap="256m")
    with broker.start():
        asyncio.run(ensure_topics(broker.bootstrap, [TopicSpec("kept", 3, {})]))
    assert broker.proc is None
    assert "Kafka Server started" in (tmp_path / "kafka" / "broker.log").read_text()
    with broker.start():
        assert asyncio.run(partition_counts(broker.bootstrap, ["kept"])) == {"kept": 3}


def test_a_busy_port_is_refused_with_a_clear_message(kafka: LocalKafka, tmp_path: Path) -> None:
    with pytest.raises(LocalStackError, match="already in use"):
        LocalKafka(tmp_path, kafka.port).start()


def test_the_transaction_log_has_eight_partitions_not_fifty(kafka: LocalKafka) -> None:
    """Kafka creates ``__transaction_state`` at the first transactional producer, with 50
    partitions by default: on two cores, seconds of the first worker's start."""

    async def first_transactional_producer() -> dict[str, int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap, transactional_id="test-transaction-log"
        )
        await producer.start()  # an id from the transaction coordinator: the topic exists
        await producer.stop()
        return await partition_counts(kafka.bootstrap, ["__transaction_state"])

    assert asyncio.run(first_transactional_producer()) == {"__transaction_state": 8}


def test_the_brokers_jit_compiler_threads_are_counted(kafka: LocalKafka) -> None:
    """A JVM that has started Kafka has compiled some of it; a Python process has no JIT."""
    assert kafka.pid is not None
    assert compiler_cpu(kafka.pid) > 0
    assert compiler_cpu(os.getpid()) == 0
