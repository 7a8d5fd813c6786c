"""The label producer: started ahead of the first label, and left to it when the broker does
not answer yet (a fake producer: the integration tests publish to a real broker)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from prometheus_client import CollectorRegistry

from rl_export.runtime.metrics import WebMetrics
from rl_export.runtime.settings import load_settings
from rl_export.web import publish
from rl_export.web.labels import label_retracted
from rl_export.web.publish import Publisher


class FakeProducer:
    """Starts (or refuses to, ``down``), and records what it is sent."""

    down = False
    topic_checks = 0  # calls of ensure_service_topics

    def __init__(self) -> None:
        self.started = self.stopped = False
        self.sent: list[tuple[str, bytes]] = []
        self.options: dict[str, Any] = {}  # what make_producer was given besides the settings

    async def start(self) -> None:
        if FakeProducer.down:
            raise KafkaConnectionError("no broker")
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes, key: bytes) -> Any:
        self.sent.append((topic, key))

        async def acknowledged() -> None:
            return None

        return acknowledged()


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[FakeProducer]:
    producers: list[FakeProducer] = []

    def make(_settings: Any, **options: Any) -> FakeProducer:
        producers.append(FakeProducer())
        producers[-1].options = options
        return producers[-1]

    async def topics(_settings: Any, **_role: Any) -> None:
        FakeProducer.topic_checks += 1
        if FakeProducer.down:
            raise KafkaConnectionError("no broker")

    FakeProducer.down = False
    FakeProducer.topic_checks = 0
    monkeypatch.setattr(publish, "make_producer", make)
    monkeypatch.setattr(publish, "ensure_service_topics", topics)
    return producers


def publisher() -> Publisher:
    return Publisher(load_settings(web_publish_timeout_s=1.0), WebMetrics(CollectorRegistry()))


async def test_warming_starts_the_producer_the_first_label_then_uses(
    made: list[FakeProducer],
) -> None:
    pub = publisher()
    await pub.warm()
    assert [p.started for p in made] == [True]
    assert FakeProducer.topic_checks == 0  # the instance checked them before warming
    await pub.publish(label_retracted("acme", "bot", "tr-1", "ana", datetime.now(UTC)))
    assert len(made) == 1  # no second producer for the label
    assert made[0].sent == [(pub.settings.topic_labels, b"tr-1")]
    assert made[0].options == {"linger_ms": 0}  # a request waits for its one record
    await pub.close()
    assert made[0].stopped


async def test_a_broker_down_at_warming_is_left_to_the_first_label(
    made: list[FakeProducer],
) -> None:
    pub = publisher()
    FakeProducer.down = True
    await pub.warm()  # no exception: the instance starts all the same
    assert not any(p.started for p in made)
    FakeProducer.down = False
    await pub.publish(label_retracted("acme", "bot", "tr-1", "ana", datetime.now(UTC)))
    assert [p.started for p in made][-1]
    assert made[-1].sent == [(pub.settings.topic_labels, b"tr-1")]
    await pub.close()
