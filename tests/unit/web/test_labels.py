"""The label events the API publishes are what the worker accepts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson

from rl_export.model.events import LabelSubmitted, Rubric, decode_event
from rl_export.web.labels import encode, label_retracted, label_skipped, label_submitted

NOW = datetime(2026, 3, 1, 12, 30, 0, 123456, tzinfo=UTC)


def test_events_decode_as_the_worker_decodes_them() -> None:
    rubric = Rubric(correctness=5, helpfulness=4, efficiency=3, safety=5).model_dump()
    events = [
        label_submitted("acme", "bot", "tr-1", "ana", rubric=rubric, comment="fine", now=NOW),
        label_submitted("acme", "bot", "tr-1", "ana", rubric=rubric, comment=None, now=NOW),
        label_submitted(
            "acme",
            "bot",
            "tr-1",
            "ana",
            rubric={"q": "yes", "n": "x"},
            comment=None,
            now=NOW,
            rubric_version=3,
            kind="adjudication",
        ),
        label_skipped("acme", "bot", "tr-1", "ana", NOW),
        label_retracted("acme", "bot", "tr-1", "ana", NOW),
    ]
    for event in events:
        raw = encode(event)
        decoded = decode_event(raw, max_bytes=1 << 20, now=NOW, future_tolerance_s=60,
                               key=b"tr-1")  # fmt: skip
        assert decoded == event
        value = orjson.loads(raw)
        assert value["occurred_at"] == "2026-03-01T12:30:00.123456Z"
        assert value["labeler"] == "ana"
        assert uuid.UUID(value["event_id"]).version == 4
        assert "comment" not in value or value["comment"] == "fine"
    assert isinstance(events[0], LabelSubmitted)
    assert events[0].event_id != events[1].event_id
    # A version-0 label is published as before rubrics: no rubric_version, no kind.
    assert set(orjson.loads(encode(events[1]))) == {
        "event_id",
        "event_type",
        "occurred_at",
        "org",
        "project",
        "trace_id",
        "labeler",
        "rubric",
    }
    assert orjson.loads(encode(events[2]))["rubric_version"] == 3
