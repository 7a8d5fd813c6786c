"""The local Apache Kafka broker: restarts keep data; a busy port is refused clearly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rl_export.common.errors import LocalStackError
from rl_export.common.net import free_port
from rl_export.local.broker import LocalKafka
from rl_export.stream.topics import TopicSpec, ensure_topics, partition_counts


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
